# The layer extractor inflates gzip with isa-l (core/extract.c).
PKGS += libisal
