"""fp8 (e5m2) exchange after Oyama et al. 2020: the kernels, the saturating sums, each tensor's range, the codec."""
