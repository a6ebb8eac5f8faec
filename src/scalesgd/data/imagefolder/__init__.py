"""Image folders in the ImageNet layout, streamed: found and pre-scanned (`scan`), decoded one file at a time (`files`),
cropped as the papers crop (`transforms`), and written for tests and benchmarks (`trees`)."""
