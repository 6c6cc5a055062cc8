# The reference pages in charts/gkm/docs/ that are generated from their
# sources by spec/lib/refdocs.py: the CRDs, every command's --help, and the
# metrics of a real scrape (spec/e2e/metrics.py; the agent's and operator's
# Kubernetes metrics need the real control plane, GKM_KUBE_ASSETS, or
# refdocs.py stops naming the metrics it lacks). spec/e2e/docs.py fails when
# a committed page no longer matches its source.
# This file is included before the Makefile's first rule: keep `make` = `make all`.
.DEFAULT_GOAL := all

REFDOCS_DIR := charts/gkm/docs
REFDOCS     := /usr/bin/python3 spec/lib/refdocs.py

.PHONY: reference-docs
reference-docs: $(BUILD)/gkm
	$(REFDOCS) crds > $(REFDOCS_DIR)/crds.md.tmp
	$(REFDOCS) commands $(BUILD)/gkm > $(REFDOCS_DIR)/commands.md.tmp
	GKM_BIN=$(abspath $(BUILD)/gkm) GKM_ROOT=$(CURDIR) GKM_METRICS_DUMP=$(abspath $(BUILD))/metrics-scrape.json \
		/usr/bin/python3 spec/e2e/metrics.py > $(BUILD)/metrics-scrape.tap
	$(REFDOCS) metrics $(BUILD)/metrics-scrape.json > $(REFDOCS_DIR)/metrics.md.tmp
	@for f in crds commands metrics; do mv $(REFDOCS_DIR)/$$f.md.tmp $(REFDOCS_DIR)/$$f.md; done
	@echo "wrote $(REFDOCS_DIR)/crds.md, commands.md, metrics.md"
