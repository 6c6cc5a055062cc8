# CSI node plugin: build/gkm-csi.so, the module `gkm csi` loads (core/cmd/module.h),
# so that only the CSI plugin maps gRPC and its C++ runtime; the other daemons
# stay lean. Its C sources are csi/*.c and those generated from csi/csi.proto
# with protoc-c; it calls into the gkm binary (linked -rdynamic) for the rest.
# csi.proto imports google/protobuf/wrappers.proto (ProbeResponse.ready), and
# libprotobuf-c ships no code for the well-known types, so that one is
# generated from the copy libprotobuf-dev installs.
# This file is included before the Makefile's first rule: keep `all` the default.
.DEFAULT_GOAL := all

PROTO_INCLUDE ?= /usr/include
CSI_GEN := $(BUILD)/gen/csi.pb-c.c $(BUILD)/gen/google/protobuf/wrappers.pb-c.c
CSI_GEN_H := $(CSI_GEN:.c=.h)
CSI_PKGS := grpc libprotobuf-c
CSI_LIBS = $(shell pkg-config --libs $(CSI_PKGS) 2>/dev/null)
CSI_CFLAGS = $(shell pkg-config --cflags $(CSI_PKGS) 2>/dev/null)
CSI_SRCS := $(wildcard csi/*.c) $(CSI_GEN)
CSI_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(CSI_SRCS))
CSI_SAN_OBJS := $(patsubst %.c,$(BUILD)/san/%.o,$(CSI_SRCS))

all: $(BUILD)/gkm-csi.so
$(CSI_OBJS) $(CSI_SAN_OBJS): ALL_CFLAGS += $(CSI_CFLAGS)
spec-extra:: $(BUILD)/gkm-san-csi.so

$(BUILD)/gkm-csi.so: $(CSI_OBJS)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) -shared -o $@ $^ -Wl,--as-needed $(CSI_LIBS)

$(BUILD)/gkm-san-csi.so: $(CSI_SAN_OBJS)
	@echo "  LD san  $@"
	$(Q)$(CC) $(CFLAGS) $(SAN) -shared -o $@ $^ -Wl,--as-needed $(CSI_LIBS)

$(BUILD)/gen/csi.pb-c.c $(BUILD)/gen/csi.pb-c.h &: csi/csi.proto \
		| $(BUILD)/gen/google/protobuf/wrappers.pb-c.h inputs
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Icsi -I$(PROTO_INCLUDE) csi/csi.proto

$(BUILD)/gen/google/protobuf/wrappers.pb-c.c $(BUILD)/gen/google/protobuf/wrappers.pb-c.h &: \
		$(PROTO_INCLUDE)/google/protobuf/wrappers.proto | inputs
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -I$(PROTO_INCLUDE) google/protobuf/wrappers.proto

# The file comes from libprotobuf-dev. Where it is missing, the input check
# (core/inputs.sh) runs first and names the package; this rule, with no
# recipe, only keeps make from stopping at "No rule to make target" before.
$(PROTO_INCLUDE)/google/protobuf/wrappers.proto: | inputs

# Everything under csi/ (and the unit tests) may include the generated
# headers: make sure they exist before the first compile (later builds know
# the dependency from the .d files).
$(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard csi/*.c)) \
$(patsubst %.c,$(BUILD)/san/%.o,$(wildcard csi/*.c)) \
$(patsubst spec/unit/%.c,$(BUILD)/unit/%,$(wildcard spec/unit/test_csi*.c)): | $(CSI_GEN_H)

# Unit tests of the plugin include its headers and link its objects.
CSI_UNIT_BINS := $(patsubst spec/unit/%.c,$(BUILD)/unit/%,$(wildcard spec/unit/test_csi*.c))
$(CSI_UNIT_BINS): ALL_CFLAGS += -Icsi $(CSI_CFLAGS)
$(CSI_UNIT_BINS): PKG_LIBS += $(CSI_LIBS)
$(CSI_UNIT_BINS): $(CSI_SAN_OBJS)
