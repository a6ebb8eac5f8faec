"""`python -m scalesgd.elastic --min-workers N`: a coordinator on this host for members on others."""

from scalesgd.elastic.coordinator import main

if __name__ == "__main__":
    main()
