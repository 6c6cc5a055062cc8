#!/usr/bin/python3
"""The documentation against what it documents: the generated reference pages
(charts/gkm/docs/crds.md, commands.md, metrics.md) match their sources, every
metric registered in the C sources and every key of the chart's ConfigMaps
has a row, every reason the policies and daemons can report has a
troubleshooting row, and every `gkm` command line and `make` target in the
README and the hand-written pages exists with the flags it is shown with."""
import os
import re
import subprocess
import sys

ROOT = os.environ.get("GKM_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "spec", "lib"))
import refdocs  # noqa: E402
from tap import Tap  # noqa: E402

GKM = os.environ.get("GKM_BIN") or os.path.join(ROOT, "build", "gkm")
BUILD = os.environ.get("GKM_BUILD") or os.path.join(ROOT, "build")
RENDER = os.path.join(BUILD, "spec", "gkm-chart-render")
DOCS = os.path.join(ROOT, "charts", "gkm", "docs")
GENERATED = ("crds.md", "commands.md", "metrics.md")
# the README and every page of the docs folder that is not generated
HANDWRITTEN = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md") and f not in GENERATED)

t = Tap()


def read(p):
    with open(p) as f:
        return f.read()


def first_diff(a, b):
    al, bl = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(al, bl)):
        if x != y:
            return "line %d:\n  committed: %s\n  generated: %s" % (i + 1, x, y)
    return "lengths differ: %d vs %d lines" % (len(al), len(bl))


def test_generated():
    for name, gen in (("crds.md", refdocs.crds_md), ("commands.md", lambda: refdocs.commands_md(GKM))):
        have, want = read(os.path.join(DOCS, name)), gen()
        t.ok(have == want, "%s matches its source (else: make reference-docs)" % name,
             diag=None if have == want else first_diff(have, want))


def table_rows(text):
    """The first cells of every table row (backquotes removed)."""
    return [re.sub(r"`", "", line.split("|")[1]).strip() for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def test_metrics():
    text = read(os.path.join(DOCS, "metrics.md"))
    rows = {}
    for line in text.split("## Label values")[0].splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 5 and cells[0].startswith("`gkm_"):
            rows[cells[0].strip("`")] = (cells[1], [x.strip("` ") for x in cells[2].split(",") if x.strip()])
    code = {m["name"]: (m["type"], m["labels"]) for m in refdocs.code_metrics(ROOT)}
    t.ok(len(code) >= 20, "the C sources register the metrics (%d found)" % len(code), diag=sorted(code))
    missing = sorted(set(code) - set(rows))
    t.ok(not missing, "every metric in the code has a row in metrics.md", diag=missing)
    stale = sorted(set(rows) - set(code))
    t.ok(not stale, "metrics.md lists no metric the code lacks", diag=stale)
    wrong = sorted(n for n in set(code) & set(rows) if code[n] != rows[n])
    t.ok(not wrong, "metrics.md has each metric's type and labels as the code registers them",
         diag=["%s: doc %s, code %s" % (n, rows[n], code[n]) for n in wrong])
    labelled = {m for m, (_, labels) in code.items() if labels}
    documented = set(re.findall(r"`(gkm_[a-z_]+)`", text.split("## Label values")[1]))
    t.ok(labelled <= documented, "the label values of every labelled metric are listed",
         diag=sorted(labelled - documented))


def test_config():
    if not os.access(RENDER, os.X_OK):
        t.ok(False, "the chart renderer is built (make spec-extra)", diag=RENDER)
        return
    import yaml
    keys = {}
    with open(os.path.join(BUILD, "docs-test-values.yaml"), "w") as f:
        f.write('gpu:\n  source: file\n  file:\n    json: \'{"gpus": []}\'\n')
    for args in ([], ["-f", f.name]):
        p = subprocess.run([RENDER, "--release", "gkm", "--namespace", "gkm", *args, os.path.join(ROOT, "charts", "gkm")],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            t.ok(False, "the chart renders", diag=p.stderr)
            return
        for d in yaml.safe_load_all(p.stdout):
            if d and d.get("kind") == "ConfigMap" and d["metadata"]["name"] in ("gkm-config", "gkm-policies"):
                keys.setdefault(d["metadata"]["name"], set()).update(d.get("data") or {})
    text = read(os.path.join(DOCS, "config.md"))
    for cm in ("gkm-config", "gkm-policies"):
        section = text.split("## " + cm + "\n")[1].split("\n## ")[0]
        rows = {r for r in table_rows(section) if r not in ("key", "annotation") and not r.startswith("gkm.io/")}
        missing = sorted(keys.get(cm, set()) - rows)
        t.ok(keys.get(cm) and not missing, "config.md documents every key of %s" % cm,
             diag="keys %s; undocumented: %s" % (sorted(keys.get(cm, [])), missing))
        # a row the chart never renders must say so (keys read when present)
        stale = sorted(r for r in rows - keys.get(cm, set()) if "not set by the chart" not in section.split(r, 1)[1].split("\n")[0])
        t.ok(not stale, "config.md documents no %s key the chart lacks" % cm, diag=stale)


# Capitalised literals in the sources that are not reasons.
NOT_REASONS = {"True", "False", "Unknown", "GKMCache", "ClusterGKMCache", "GKMCacheNode",
               "ClusterGKMCacheNode", "Node", "Labels", "Normal", "Warning", "CREATE", "UPDATE",
               "CamelCaseReason", "Allowed", "Verified", "Ready", "Progressing", "Error", "Pending",
               "Pulling", "Failed", "Incompatible", "ConfigMap"}


def csi_node_sources():
    """(path, text) of the CSI node service's files (csi/csi_node*.c)."""
    names = sorted(f for f in os.listdir(os.path.join(ROOT, "csi"))
                   if f.startswith("csi_node") and f.endswith(".c"))
    return [("csi/" + f, read(os.path.join(ROOT, "csi", f))) for f in names]


def source_reasons():
    """{reason: where} for every reason word the policies and daemons write."""
    out = {}
    lit = re.compile(r'"([A-Z][a-z]+(?:[A-Z][a-z0-9]*)*)"')
    for rel in ("policies/compat.lua", "policies/aggregate.lua", "policies/admission.lua",
                "lua/gkm/agent.lua", "core/node/agent.c", "core/node/fallback_notice.h",
                "core/node/operator.c", "core/cmd/cmd_daemons.c", "webhook/reviewer.c",
                "webhook/review.c"):
        for word in lit.findall(read(os.path.join(ROOT, rel))):
            if word not in NOT_REASONS:
                out.setdefault(word, rel)
    for rel, text in csi_node_sources():
        for code in re.findall(r"fail\(\s*r, (?:[^,;]*\? )?CSI_([A-Z_]+)", text):
            out.setdefault(code, rel)
    return out


def test_troubleshooting():
    text = read(os.path.join(DOCS, "troubleshooting.md"))
    documented = set()
    for line in text.splitlines():
        if line.startswith("|"):
            documented.update(re.findall(r"`([A-Za-z_]+)`", line))
    reasons = source_reasons()
    t.ok(len(reasons) > 40, "reasons found in the sources (%d)" % len(reasons), diag=sorted(reasons))
    missing = sorted("%s (%s)" % (r, w) for r, w in reasons.items() if r not in documented)
    t.ok(not missing, "troubleshooting.md has a row for every reason in the sources", diag=missing)


def help_of(cmd):
    p = subprocess.run([GKM, *cmd, "--help"], capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def code_blocks(text):
    """Fenced shell blocks (sh, bash), continuation lines (ending in a backslash) joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"^ *```(?:sh|bash)\n(.*?)^ *```", text, re.M | re.S)]


def test_command_lines():
    helps, problems, seen = {}, [], 0
    subs = {"cache": refdocs._subcommands(help_of(["cache"])[1])}
    for doc in HANDWRITTEN:
        for block in code_blocks(read(doc)):
            for line in block.splitlines():
                line = re.sub(r"^\$ ", "", line.strip())
                if not line.startswith("gkm "):
                    continue
                words = line.split("#")[0].split()
                cmd = words[1:2] + ([words[2]] if words[1] in subs and len(words) > 2 and words[2] in subs[words[1]] else [])
                key = " ".join(cmd)
                if key not in helps:
                    helps[key] = help_of(cmd)
                rc, text = helps[key]
                seen += 1
                if rc != 0:
                    problems.append("%s: `gkm %s --help` fails" % (os.path.basename(doc), key))
                    continue
                for w in (x.strip("[]") for x in words):
                    flag = w.split("=")[0]
                    if flag.startswith("--") and flag != "--" and not re.search(re.escape(flag) + r"\b", text):
                        problems.append("%s: %s: no flag %s in `gkm %s --help`" % (os.path.basename(doc), line, flag, key))
                    elif re.fullmatch(r"-[a-zA-Z]", w) and not re.search(r"(^|[\s\[|,])" + w + r"\b", text):
                        problems.append("%s: %s: no flag %s in `gkm %s --help`" % (os.path.basename(doc), line, w, key))
    t.ok(seen > 20 and not problems, "every gkm command line in the docs (%d) uses real commands and flags" % seen,
         diag="\n".join(problems))
    # flags named in prose (`--flag`) exist in some command's --help
    every = read(os.path.join(DOCS, "commands.md"))
    prose = []
    for doc in (d for d in HANDWRITTEN if not d.endswith("testing.md")):  # that one: the test server's
        for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", read(doc)):
            if not re.search(re.escape(flag) + r"\b", every):
                prose.append("%s: %s" % (os.path.basename(doc), flag))
    t.ok(not prose, "every --flag the docs name in prose is a flag of some command", diag=sorted(set(prose)))


def test_make_targets():
    rules = ""
    for f in ["Makefile"] + [os.path.join(d, x) for d in ("core", "webhook", "csi", "spec")
                             for x in os.listdir(os.path.join(ROOT, d)) if x.endswith(".mk")]:
        rules += read(os.path.join(ROOT, f))
    targets = set(re.findall(r"^([a-z][a-z-]*)\s*::?(?!=)", rules, re.M))
    problems = []
    for doc in HANDWRITTEN:
        for block in code_blocks(read(doc)):
            for target in re.findall(r"(?:^|\s)make ((?:[a-z][a-z-]* ?)+)", block, re.M):
                for name in target.split():
                    if name not in targets:
                        problems.append("%s: make %s" % (os.path.basename(doc), name))
    t.ok(not problems, "every make target in the docs exists", diag=problems)


def values_paths(text):
    """Chart values a text names: --set/--set-file KEY=..., and `a.b.c` in prose."""
    import yaml
    top = yaml.safe_load(read(os.path.join(ROOT, "charts", "gkm", "values.yaml")))
    names = re.findall(r"--set(?:-file|-string)? ([A-Za-z0-9_.\\]+)=", text)
    names += [m for m in re.findall(r"`([a-z][A-Za-z]*(?:\.[A-Za-z0-9_]+)+)(?:=[^`]*)?`", text)
              if m.split(".")[0] in top]
    return top, names


def test_chart_values():
    problems, seen = [], 0
    for doc in HANDWRITTEN:
        top, names = values_paths(read(doc))
        for name in names:
            seen += 1
            node = top
            for part in re.split(r"(?<!\\)\.", name):
                part = part.replace("\\.", ".")
                if isinstance(node, dict) and part in node:
                    node = node[part]
                elif isinstance(node, dict) and not node:
                    break  # a free-form map (trustedKeys, overrides): any key
                else:
                    problems.append("%s: %s" % (os.path.basename(doc), name))
                    break
    t.ok(seen > 10 and not problems, "every chart value the docs name (%d) is in values.yaml" % seen,
         diag=problems)


def test_links_and_first_screen():
    problems = []
    for doc in HANDWRITTEN + [os.path.join(DOCS, f) for f in GENERATED]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", read(doc)):
            if re.match(r"[a-z]+:", target):
                continue
            if not os.path.exists(os.path.join(os.path.dirname(doc), target)):
                problems.append("%s: %s" % (os.path.relpath(doc, ROOT), target))
    t.ok(not problems, "every relative link in the docs resolves", diag=problems)
    readme = read(os.path.join(ROOT, "README.md"))
    head = "\n".join(readme.splitlines()[:20])
    t.ok("make run" in head and "make test" in head, "README: make run and make test on the first screen")
    # the README is the front door: it links every page, the pages hold the rest
    unlinked = sorted(f for f in os.listdir(DOCS) if f.endswith(".md") and "](charts/gkm/docs/%s" % f not in readme)
    t.ok(not unlinked, "README links every page of charts/gkm/docs", diag=unlinked)
    lines = len(readme.splitlines())
    t.ok(lines < 400, "README stays under 400 lines (%d); the details go to charts/gkm/docs" % lines)


def test_source_paths():
    """Every source file the docs name (`core/...`, `webhook/...`, `csi/...`,
    `lua/...`, `policies/...`, `spec/...` in backquotes) exists; a `*`
    stands for any part of a name."""
    import glob
    missing = []
    for doc in HANDWRITTEN + [os.path.join(ROOT, "core", "README.md")]:
        for path in re.findall(r"`((?:core|webhook|csi|lua|policies|spec)/[\w/.*-]+\.(?:c|h|lua|py|sh))`", read(doc)):
            if not glob.glob(os.path.join(ROOT, path)):
                missing.append("%s: %s" % (os.path.relpath(doc, ROOT), path))
    t.ok(not missing, "every source file the docs name exists", diag=missing)


def csi_attributes(text):
    """The volumeAttributes of the csi.gkm.io volumes in a text's YAML blocks."""
    import yaml
    shown = set()
    for block in re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S):
        for d in yaml.safe_load_all(block):
            for vol in ((d or {}).get("spec") or {}).get("volumes") or (d or {}).get("volumes") or []:
                if (vol.get("csi") or {}).get("driver") == "csi.gkm.io":
                    shown.update(vol["csi"].get("volumeAttributes") or {})
    return shown


def test_pod_example():
    """The CSI attributes the README and the usage page show are the ones the plugin reads."""
    csi = "".join(text for _rel, text in csi_node_sources())
    for doc in (os.path.join(ROOT, "README.md"), os.path.join(DOCS, "usage.md")):
        shown = csi_attributes(read(doc))
        unknown = sorted(a for a in shown if '"%s"' % a not in csi)
        t.ok(shown and not unknown, "%s: its csi.gkm.io volume attributes are read by the plugin (%s)"
             % (os.path.relpath(doc, ROOT), ", ".join(sorted(shown))), diag=unknown)


def test_namespace():
    """Daemons run without POD_NAMESPACE (outside the chart) use the namespace
    the README installs the chart into."""
    readme = read(os.path.join(ROOT, "README.md"))
    installs = set(re.findall(r"helm install gkm charts/gkm -n (\S+)", readme))
    makefile = set(re.findall(r"^MANIFESTS_NAMESPACE \?= (\S+)", read(os.path.join(ROOT, "Makefile")), re.M))
    defaults = {}
    for cmd in ("operator", "agent", "webhook"):
        _rc, out = help_of([cmd])
        m = re.search(r"--namespace NS.*?\(default \$POD_NAMESPACE, else (\S+?)\)", out, re.S)
        defaults[cmd] = m.group(1) if m else None
    want = installs | makefile
    t.ok(len(want) == 1 and set(v for v in defaults.values() if v) == want and defaults["operator"],
         "the daemons' --namespace default is the namespace the README and `make manifests` install into",
         diag={"README/Makefile": sorted(want), "--help defaults": defaults})


for name, fn in (("generated pages", test_generated), ("metrics", test_metrics), ("config", test_config),
                 ("troubleshooting", test_troubleshooting), ("command lines", test_command_lines),
                 ("make targets", test_make_targets), ("chart values", test_chart_values), ("links", test_links_and_first_screen),
                 ("source paths", test_source_paths),
                 ("pod example", test_pod_example), ("namespace", test_namespace)):
    t.run(name, fn)
sys.exit(t.finish())
