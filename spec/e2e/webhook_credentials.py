#!/usr/bin/python3
"""Whose registry credentials the admission webhook uses (real HTTPS, a real
docker-registry that wants a login): its own (--authfile, the
chart's registry.authSecret) serve ClusterGKMCaches and the namespaces
--global-credentials-namespaces lists; a GKMCache of any other namespace is
checked anonymously, so that a tenant cannot learn through the webhook
digests and signature states only gkm's credentials may read. Verdicts and
tag resolutions are never shared between the two."""
import base64
import json
import os
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
from proc import registry  # noqa: E402
from tap import Tap  # noqa: E402
from webhook_env import (FIXTURE, GKM, Webhook, available, cleanup, decide, init, make_ca,  # noqa: E402
                         make_cert, path, run, write)

t = Tap()
init("gkm-webhook-creds.")


def main():
    why = available()
    if why:
        t.skip("webhook credentials per namespace", why)
        return
    make_ca("ca")
    make_cert("ca", "tls", "gkm-webhook")
    subprocess.run("htpasswd -Bbn dana p4ss > '%s'" % path("htpasswd"), shell=True, check=True)
    reg, stop = registry(ROOT, "htpasswd", path("htpasswd"))
    try:
        run(GKM, "cache", "keygen", "--output-key-prefix", path("k"))
        run(GKM, "cache", "build", FIXTURE, "-t", reg + "/private/cache:v1", "--creds", "dana:p4ss")
        run(GKM, "cache", "sign", reg + "/private/cache:v1", "--key", path("k.key"), "--creds", "dana:p4ss")
        write(path("auth.json"), json.dumps({"auths": {reg: {"auth": base64.b64encode(b"dana:p4ss").decode()}}}))
        wh = Webhook("--tls-cert", path("tls.crt"), "--tls-key", path("tls.key"), "--key", path("k.pub"),
                     "--authfile", path("auth.json"), "--global-credentials-namespaces", "team-a")
        image = reg + "/private/cache:v1"
        ok = decide(wh, image, namespace="team-a")
        t.ok(ok["allowed"] and "patch" in ok, "team-a (listed): resolved and verified with the webhook's credentials",
             diag=ok)
        other = [decide(wh, image, namespace="team-b") for _ in range(2)]
        t.ok(all(not r["allowed"] and "requires a login" in r["status"]["message"]
                 and "not one gkm's own credentials serve" in r["status"]["message"] for r in other),
             "team-b (not listed), the same image just after team-a's: denied, read anonymously "
             "(nothing team-a's read learned is reused)", diag=other)
        cl = decide(wh, image, kind="ClusterGKMCache", namespace="")
        t.ok(cl["allowed"], "a ClusterGKMCache: the webhook's credentials serve it", diag=cl)
        t.ok(wh.stop() == 0, "the webhook stops cleanly")
    finally:
        stop()


try:
    main()
finally:
    cleanup()
    t.finish()
