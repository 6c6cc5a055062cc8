# Test artefacts of the GPU probes: a stand-in libnvidia-ml.so.1 (see
# spec/fake_nvml/fake_nvml.c), as an R550+ driver and as an R470 one.
# This file is included before the Makefile's first rule: keep `make` = `make all`.
.DEFAULT_GOAL := all

FAKE_NVML := $(BUILD)/spec/fake_nvml/libnvidia-ml.so.1 \
	$(BUILD)/spec/fake_nvml/legacy/libnvidia-ml.so.1

$(BUILD)/spec/fake_nvml/libnvidia-ml.so.1: spec/fake_nvml/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fvisibility=hidden -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lcjson

$(BUILD)/spec/fake_nvml/legacy/libnvidia-ml.so.1: spec/fake_nvml/fake_nvml.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DFAKE_NVML_LEGACY -fvisibility=hidden -shared \
		-Wl,-soname,libnvidia-ml.so.1 -o $@ $< -lcjson

spec-extra:: $(FAKE_NVML)

# The compat benchmark (spec/bench/compat.sh builds it on demand). Its
# prerequisites are listed in the recipe: LIB_OBJS is defined after this
# file is included.
.PHONY: compat-bench
compat-bench: all
	@mkdir -p $(BUILD)/spec
	$(CC) $(ALL_CFLAGS) -o $(BUILD)/spec/compat_bench spec/bench/compat_bench.c \
		$(LIB_OBJS) $(PKG_LIBS)
