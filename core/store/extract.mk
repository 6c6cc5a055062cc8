# The layer extractor inflates gzip with isa-l (core/store/extract.c).
PKGS += libisal
