# The Kubernetes client's test driver (spec/lib/kubetool.c): built with the
# sanitizers for the end-to-end tests, and optimised for the benchmark.
# This file is read before LIB_OBJS/SAN_OBJS are set: the prerequisites name
# the binaries that depend on all of them, the recipes (expanded late) link them.
KUBETOOL := $(BUILD)/spec/kubetool $(BUILD)/spec/kubetool-opt

$(BUILD)/spec/kubetool: spec/lib/kubetool.c $(BUILD)/gkm-san
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SAN) -o $@ spec/lib/kubetool.c $(SAN_OBJS) $(PKG_LIBS)

$(BUILD)/spec/kubetool-opt: spec/lib/kubetool.c $(BUILD)/gkm
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ spec/lib/kubetool.c $(LIB_OBJS) $(PKG_LIBS)

spec-extra:: $(KUBETOOL)
