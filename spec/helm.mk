# The chart renderer used by the chart tests and `make manifests`: Helm's
# template language (text/template + sprig) plus Helm's built-ins, built
# offline from Debian's Go packages in GOPATH mode (golang-1.19-go,
# golang-github-masterminds-sprig-dev, golang-gopkg-yaml.v3-dev).
# This file is included before the Makefile's first rule: keep `make` = `make all`.
.DEFAULT_GOAL := all

GO_1_19      ?= /usr/lib/go-1.19/bin/go
CHART_RENDER := $(BUILD)/spec/gkm-chart-render

$(CHART_RENDER): $(wildcard spec/helm/*.go)
	@mkdir -p $(dir $@)
	@echo "  GO      $@"
	$(Q)GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE=$(abspath $(BUILD))/gocache \
		$(GO_1_19) build -o $@ ./spec/helm

spec-extra:: $(CHART_RENDER)
