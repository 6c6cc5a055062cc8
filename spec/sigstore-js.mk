# sigstore-js (@sigstore/sign, @sigstore/bundle, @sigstore/oci,
# @sigstore/verify), an independent sigstore implementation the end-to-end
# test spec/e2e/signatures_sigstore_js.sh signs and verifies with. `make
# sigstore-js` installs the versions pinned in spec/sigstore-js/package-lock.json
# from the npm registry into spec/sigstore-js/node_modules (ignored by git);
# `make test` runs it through spec-extra. Without node/npm, or when the
# install fails, it says why and the test skips, naming this target.
# This file is included before the Makefile's first rule: keep `make` = `make all`.
.DEFAULT_GOAL := all

SIGSTORE_JS := spec/sigstore-js/node_modules/.package-lock.json

.PHONY: sigstore-js
sigstore-js: $(SIGSTORE_JS)

$(SIGSTORE_JS): spec/sigstore-js/package.json spec/sigstore-js/package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "  NPM     skipped: npm is not installed (sigstore-js tests will skip)"; \
	elif ! (cd spec/sigstore-js && npm ci --no-audit --no-fund --loglevel=error >/dev/null); then \
		echo "  NPM     failed: sigstore-js not installed (sigstore-js tests will skip)"; \
	else \
		echo "  NPM     spec/sigstore-js"; \
	fi

spec-extra:: sigstore-js
