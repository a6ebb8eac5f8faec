#!/usr/bin/env bash
# the image classifier at 100 Mbit/s: the 10 Mbit/s run's script at this rate
RATE=100 exec bash "$(dirname "$0")/../quality-digits-10mbit/run.sh"
