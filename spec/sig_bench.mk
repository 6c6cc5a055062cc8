# The signature benchmark's driver (spec/bench/sig_bench.c, run by
# spec/bench/signatures.sh through `make sig-bench`). This file is read
# before LIB_OBJS is set: the prerequisite names the binary that depends on
# all of them, the recipe (expanded late) links them.
.PHONY: sig-bench
sig-bench: $(BUILD)/spec/sig_bench

$(BUILD)/spec/sig_bench: spec/bench/sig_bench.c spec/unit/fake_sigstore.h $(BUILD)/gkm
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ spec/bench/sig_bench.c $(LIB_OBJS) $(PKG_LIBS)
