# gkm: GPU kernel cache manager. See README.md.
#
# Sources are found by wildcard: a new core/*.c or webhook/*.c is built into
# the gkm binary, a new csi/*.c into its CSI module (csi/csi.mk), without
# touching this file; spec/unit/test_*.c are
# cmocka tests built with the sanitizers; extra build rules live next to what
# they build in */*.mk files (included below).

BUILD     ?= build
PREFIX    ?= /usr/local
CC        ?= cc
Q         ?= @
VERSION   := $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)

# Every Debian package the build, the tests and the benchmarks need.
DEPS := build-essential pkg-config git ca-certificates \
	liblua5.4-dev lua5.4 libcurl4-openssl-dev libcjson-dev libarchive-dev \
	libyaml-dev libssl-dev libmicrohttpd-dev libgrpc-dev libprotobuf-c-dev \
	protobuf-c-compiler protobuf-compiler libprotobuf-dev libzstd-dev zlib1g-dev libisal-dev libdeflate-dev \
	libcmocka-dev lua-busted lua-check clang-format cppcheck \
	docker-registry skopeo umoci apache2-utils openssl curl \
	python3 python3-grpcio python3-grpc-tools python3-yaml \
	golang-1.19-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev golang-google-protobuf-dev \
	libarchive-tools zstd isal time wrk hyperfine e2fsprogs \
	etcd-server xz-utils containerd runc containernetworking-plugins busybox-static

PKGS := lua5.4 libcurl libcjson libarchive yaml-0.1 openssl libmicrohttpd zlib libzstd
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -ldl -lm

WARN     := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-unused-parameter
CFLAGS   ?= -O2 -g
# core/ is one folder per layer (core/README.md); headers are named without it
CORE_INCLUDES := $(patsubst %/,-I%,$(sort $(dir $(wildcard core/*/*.h))))
ALL_CFLAGS = -std=gnu11 -fPIC $(WARN) $(CFLAGS) -D_GNU_SOURCE -DGKM_VERSION='"$(VERSION)"' \
	$(CORE_INCLUDES) -I$(BUILD)/gen $(PKG_CFLAGS)
SAN      := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

EMBED_FILES := $(sort $(shell find lua policies -name '*.lua' 2>/dev/null))

.DEFAULT_GOAL := all

-include $(wildcard core/*/*.mk webhook/*.mk csi/*.mk spec/*.mk)

MAIN_SRC := core/cmd/main.c
LIB_SRCS := $(filter-out $(MAIN_SRC),$(wildcard core/*/*.c webhook/*.c))
LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRCS)) $(BUILD)/obj/embedded.o
SAN_OBJS := $(patsubst %.c,$(BUILD)/san/%.o,$(LIB_SRCS)) $(BUILD)/san/embedded.o
UNIT_SRCS := $(wildcard spec/unit/test_*.c)
UNIT_BINS := $(patsubst spec/unit/%.c,$(BUILD)/unit/%,$(UNIT_SRCS))
SPEC_MOD  := $(BUILD)/spec/gkmspec.so

.PHONY: all deps test unit-tests lint format bench run install clean manifests image
all: $(BUILD)/gkm

$(BUILD)/gkm: $(BUILD)/obj/core/cmd/main.o $(LIB_OBJS)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) -rdynamic -o $@ $^ -Wl,--as-needed $(PKG_LIBS)

# The same binary built with the sanitizers, for end-to-end tests of bad input.
$(BUILD)/gkm-san: $(BUILD)/san/core/cmd/main.o $(SAN_OBJS)
	@echo "  LD san  $@"
	$(Q)$(CC) $(CFLAGS) $(SAN) -rdynamic -o $@ $^ -Wl,--as-needed $(PKG_LIBS)

# Nothing is compiled before the build's inputs are checked (core/inputs.sh):
# a missing one is named with its Debian package, never as a make error.
# `make test` checks the test programs' inputs too.
INPUTS ?= build
.PHONY: inputs
inputs:
	@PROTO_INCLUDE=$(PROTO_INCLUDE) GO_1_19=$(GO_1_19) sh core/inputs.sh $(INPUTS)

$(BUILD)/obj/%.o: %.c | inputs
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/san/%.o: %.c | inputs
	@mkdir -p $(dir $@)
	@echo "  CC san  $<"
	$(Q)$(CC) $(ALL_CFLAGS) $(SAN) -MMD -MP -c -o $@ $<

# Lua and policy files are compiled into the binary (.incbin keeps them byte-exact).
$(BUILD)/gen/embedded.S: $(EMBED_FILES) core/embed.sh | inputs
	@mkdir -p $(dir $@)
	sh core/embed.sh $(EMBED_FILES) > $@
$(BUILD)/obj/embedded.o: $(BUILD)/gen/embedded.S
	@mkdir -p $(dir $@)
	$(CC) -c -o $@ $<
$(BUILD)/san/embedded.o: $(BUILD)/gen/embedded.S
	@mkdir -p $(dir $@)
	$(CC) -c -o $@ $<

$(BUILD)/unit/%: spec/unit/%.c $(SAN_OBJS)
	@mkdir -p $(dir $@)
	@echo "  TEST    $@"
	$(Q)$(CC) $(ALL_CFLAGS) $(SAN) -Ispec/unit -o $@ $^ $(PKG_LIBS) -lcmocka

# The Lua module busted specs use to drive the real engine and sandbox.
# lua5.4 on Debian is statically linked and exports the Lua API, so the module
# must not bring a second copy of liblua (two Lua VMs in one process break).
$(SPEC_MOD): spec/lib/gkmspec.c $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -shared -o $@ $^ $(filter-out -llua5.4,$(PKG_LIBS))

unit-tests: $(UNIT_BINS)

deps:
	@sh core/deps.sh $(DEPS)

test: deps
	@$(MAKE) --no-print-directory -j$$(nproc) INPUTS="build test" \
		all $(BUILD)/gkm-san unit-tests $(SPEC_MOD) spec-extra
	@BUILD=$(BUILD) bash spec/run.sh

# Extra test artefacts (fake libraries, generated stubs) hook in here from */*.mk.
.PHONY: spec-extra
spec-extra::

lint:
	clang-format --dry-run --Werror $(wildcard core/*/*.[ch] webhook/*.[ch] csi/*.[ch] spec/unit/*.[ch] spec/lib/*.[ch])
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
		--suppress=missingIncludeSystem -D__GNUC__ $(CORE_INCLUDES) \
		--include=spec/lint/cppcheck.h core webhook csi
	luacheck --quiet lua policies spec/lua

format:
	clang-format -i $(wildcard core/*/*.[ch] webhook/*.[ch] csi/*.[ch] spec/unit/*.[ch] spec/lib/*.[ch])

bench: deps all
	@BUILD=$(BUILD) bash spec/bench/run.sh

run: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bash core/demo.sh

install: all
	install -D -m 0755 $(BUILD)/gkm $(DESTDIR)$(PREFIX)/bin/gkm
	install -D -m 0644 $(BUILD)/gkm-csi.so $(DESTDIR)$(PREFIX)/lib/gkm/gkm-csi.so

# The chart as plain YAML (namespace, CRDs, everything) for clusters without
# Helm: kubectl apply --server-side -f build/manifests/gkm.yaml
MANIFESTS_NAMESPACE ?= gkm
manifests: $(CHART_RENDER)
	@mkdir -p $(BUILD)/manifests
	$(CHART_RENDER) --create-namespace --include-crds --namespace $(MANIFESTS_NAMESPACE) \
		charts/gkm > $(BUILD)/manifests/gkm.yaml.tmp
	@mv $(BUILD)/manifests/gkm.yaml.tmp $(BUILD)/manifests/gkm.yaml
	@echo "wrote $(BUILD)/manifests/gkm.yaml (namespace $(MANIFESTS_NAMESPACE))"

# The container image (Containerfile), with buildah or podman.
IMAGE ?= localhost/gkm:$(VERSION)
image:
	@if command -v buildah >/dev/null 2>&1; then \
		buildah bud --layers -f Containerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) . ; \
	elif command -v podman >/dev/null 2>&1; then \
		podman build -f Containerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) . ; \
	else \
		echo "make image: neither buildah nor podman is installed (apt-get install buildah)." >&2; \
		echo "On a machine with one: buildah bud -f Containerfile --build-arg VERSION=$(VERSION) -t $(IMAGE) ." >&2; \
		exit 1; \
	fi

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' -type f 2>/dev/null)
