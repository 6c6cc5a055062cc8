# Test artefacts of the GPU probes: a stand-in libnvidia-ml.so.1 (see
# spec/fake_nvml/fake_nvml.c), as an R550+ driver and as an R470 one.
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
