# CSI node plugin: C sources generated from csi/csi.proto with protoc-c.
# csi.proto imports google/protobuf/wrappers.proto (ProbeResponse.ready), and
# libprotobuf-c ships no code for the well-known types, so that one is
# generated from the copy protobuf-compiler installs.
# This file is included before the Makefile's first rule: keep `all` the default.
.DEFAULT_GOAL := all

PROTO_INCLUDE ?= /usr/include
CSI_GEN := $(BUILD)/gen/csi.pb-c.c $(BUILD)/gen/google/protobuf/wrappers.pb-c.c
CSI_GEN_H := $(CSI_GEN:.c=.h)
GEN_SRCS += $(CSI_GEN)

$(BUILD)/gen/csi.pb-c.c $(BUILD)/gen/csi.pb-c.h &: csi/csi.proto \
		| $(BUILD)/gen/google/protobuf/wrappers.pb-c.h
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -Icsi -I$(PROTO_INCLUDE) csi/csi.proto

$(BUILD)/gen/google/protobuf/wrappers.pb-c.c $(BUILD)/gen/google/protobuf/wrappers.pb-c.h &: \
		$(PROTO_INCLUDE)/google/protobuf/wrappers.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -I$(PROTO_INCLUDE) google/protobuf/wrappers.proto

# Everything under csi/ (and the unit tests) may include the generated
# headers: make sure they exist before the first compile (later builds know
# the dependency from the .d files).
$(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard csi/*.c)) \
$(patsubst %.c,$(BUILD)/san/%.o,$(wildcard csi/*.c)) \
$(patsubst spec/unit/%.c,$(BUILD)/unit/%,$(wildcard spec/unit/test_csi*.c)): | $(CSI_GEN_H)

# Unit tests of the plugin include its headers.
$(patsubst spec/unit/%.c,$(BUILD)/unit/%,$(wildcard spec/unit/test_csi*.c)): ALL_CFLAGS += -Icsi
