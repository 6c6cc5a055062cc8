"""Minimal TAP producer for Python end-to-end tests (stdlib only).

    t = Tap()
    t.ok(cond, "name", diag="shown when it fails")
    t.eq(got, want, "name")
    t.skip("name", "reason")
    sys.exit(t.finish())
"""
import sys
import traceback


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name, diag=None):
        self.n += 1
        if cond:
            print(f"ok {self.n} - {name}", flush=True)
        else:
            self.failed += 1
            print(f"not ok {self.n} - {name}", flush=True)
            if diag is not None:
                for line in str(diag).splitlines():
                    print(f"#   {line}", flush=True)
        return bool(cond)

    def eq(self, got, want, name):
        return self.ok(got == want, name, diag=f"got:  {got!r}\nwant: {want!r}")

    def skip(self, name, reason):
        self.n += 1
        print(f"ok {self.n} - {name} # SKIP {reason}", flush=True)

    def run(self, name, fn):
        """Run fn(); an exception is a failure with its traceback as diagnostics."""
        try:
            fn()
        except Exception:  # noqa: BLE001 - a test body may raise anything
            self.ok(False, name, diag=traceback.format_exc())

    def finish(self):
        print(f"1..{self.n}", flush=True)
        return 1 if self.failed else 0
