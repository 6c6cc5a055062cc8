"""What the end-to-end tests against a real control plane share: signed
caches in a real registry, a mount work directory, and the way a test's main()
is run (a failure reported, then every clean-up, also on SIGTERM)."""
import os
import shutil
import signal
import sys
import tempfile
import traceback

from proc import registry, sh


def signed_caches(gkm, root, workdir, cleanups, images):
    """Build each fixture directory of images {fixture: "repo:tag"} with
    `gkm cache build` into a new registry, sign it with a new key (its public
    half alone in workdir/trust). Returns (registry host:port, {ref: digest},
    the trust directory)."""
    reg, stop = registry(root)
    cleanups.append(stop)
    key = os.path.join(workdir, "trusted")
    sh(gkm, "cache", "keygen", "--output-key-prefix", key)
    trust = os.path.join(workdir, "trust")
    os.makedirs(trust)
    shutil.copy(key + ".pub", trust)
    digests = {}
    for fixture, name in images.items():
        ref = reg + "/" + name
        sh(gkm, "cache", "build", fixture, "-t", ref)
        sh(gkm, "cache", "sign", ref, "--key", key + ".key")
        repo, tag = name.rsplit(":", 1)
        out = sh("curl", "-sfI", "-H", "Accept: application/vnd.oci.image.manifest.v1+json",
                 "http://%s/v2/%s/manifests/%s" % (reg, repo, tag))
        digests[ref] = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                            if line.lower().startswith("docker-content-digest:"))
    return reg, digests, trust


def mount_workdir(prefix, cleanups):
    """A temporary directory, removed at the end with all that is mounted
    below it: (its path, None), or (None, why mounts cannot be made here)."""
    import csi_client
    tmp = tempfile.mkdtemp(prefix=prefix)
    cleanups.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
    cleanups.append(lambda: csi_client.unmount_below(tmp))
    why = csi_client.mount_permitted(tmp)
    return (None, why) if why else (tmp, None)


def run(t, main, cleanups):
    """Run main(); an exception is a failed test. Then every clean-up, last
    first, also when the run is stopped from outside (SIGTERM, ^C). Exits
    with the TAP result."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        main()
    except Exception:  # noqa: BLE001 - reported as a failure, then everything stops
        t.ok(False, "the test ran to its end", diag=traceback.format_exc())
    finally:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception as err:  # noqa: BLE001 - the other clean-ups still run
                print("# clean-up: %s" % err)
    sys.exit(t.finish())
