"""Where workers run: joining the process group, and the local launcher that starts and watches them."""
