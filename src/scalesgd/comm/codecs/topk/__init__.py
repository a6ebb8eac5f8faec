"""Top-k sparsification with residuals after Ju et al. (DLGS), with Deep Gradient Compression's corrections."""
