# The end-to-end tests' own sigstore (spec/lib/fake_sigstore.c over
# spec/unit/fake_sigstore.h): a Fulcio-like CA, a Rekor-like log and a
# CT-like log made with OpenSSL, writing keyless signatures as cosign does.
# This file is read before LIB_OBJS is set: the prerequisite names the binary
# that depends on all of them, the recipe (expanded late) links them.
FAKE_SIGSTORE := $(BUILD)/spec/fake-sigstore

$(FAKE_SIGSTORE): spec/lib/fake_sigstore.c spec/unit/fake_sigstore.h $(BUILD)/gkm
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -o $@ spec/lib/fake_sigstore.c $(LIB_OBJS) $(PKG_LIBS)

spec-extra:: $(FAKE_SIGSTORE)
