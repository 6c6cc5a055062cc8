# The reference spec/unit/test_base64.c compares gkm's base64 decoder with:
# Go's encoding/base64 and protobuf's JSON mapping themselves (spec/base64go),
# built offline in GOPATH mode from Debian's golang-1.19-go and
# golang-google-protobuf-dev. Where either is missing nothing is built and
# the test says why it skips.
# This file is included before the Makefile's first rule: keep `make` = `make all`.
.DEFAULT_GOAL := all

GO_1_19     ?= /usr/lib/go-1.19/bin/go
GO_PROTOBUF := /usr/share/gocode/src/google.golang.org/protobuf
BASE64_GO   := $(BUILD)/spec/gkm-base64-go

$(BASE64_GO): $(wildcard spec/base64go/*.go)
	@mkdir -p $(dir $@)
	@echo "  GO      $@"
	$(Q)GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE=$(abspath $(BUILD))/gocache \
		$(GO_1_19) build -o $@ ./spec/base64go

ifeq ($(words $(wildcard $(GO_1_19) $(GO_PROTOBUF))),2)
spec-extra:: $(BASE64_GO)
endif
