# Fuzz targets (spec/fuzz/fuzz_*.c) for the parsers that read outside input.
# With clang's libFuzzer: build/fuzz/fuzz_<name>, run e.g.
#   build/fuzz/fuzz_tar -max_total_time=60 spec/fuzz/corpus/tar
# Without it, the same targets link with standalone.c (one run per file
# argument). `make test` only builds them (through spec-extra), never runs them.
FUZZ_SRCS := $(wildcard spec/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst spec/fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
FUZZ_LIB  := core/store/extract.c core/store/extract_decode.c core/store/extract_write.c core/base/fsutil.c core/base/toml.c core/base/fstree.c core/base/strmap.c core/oci/signature.c core/oci/keyless_root.c core/oci/keyless_rules.c core/oci/keyless_tlog.c core/oci/keyless_cert.c core/oci/keyless_verify.c core/base/yamljson.c core/base/base64.c core/base/errbuf.c core/base/textfmt.c core/base/progress.c core/base/log.c
FUZZ_CC   := $(shell echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
	| clang -fsanitize=fuzzer -x c -o /dev/null - >/dev/null 2>&1 \
	&& echo "clang -fsanitize=fuzzer,address,undefined" \
	|| echo "$(CC) -fsanitize=address,undefined spec/fuzz/standalone.c")

$(BUILD)/fuzz/%: spec/fuzz/%.c $(FUZZ_LIB) $(wildcard $(FUZZ_LIB:.c=.h)) core/store/extract_impl.h core/oci/keyless_impl.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 -g -O1 -D_GNU_SOURCE $(CORE_INCLUDES) $(PKG_CFLAGS) -o $@ $< $(FUZZ_LIB) $(PKG_LIBS)

.PHONY: fuzz
fuzz: $(FUZZ_BINS)
spec-extra:: $(FUZZ_BINS)
