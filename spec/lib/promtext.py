"""A strict parser of the Prometheus text exposition format (version 0.0.4),
for tests that scrape /metrics. Standard library only.

    fams = promtext.parse(text)          # raises promtext.Error on anything off
    fams["gkm_pulls_total"].type         # "counter"
    promtext.value(fams, "gkm_pulls_total", result="pulled")   # or None

What it refuses, beyond a line that does not parse: a family without both
HELP and TYPE, HELP or TYPE given twice or after the family's samples, a
family's samples split by another family, a sample whose name does not belong
to its family's type (histograms: _bucket with le, _sum, _count), the same
series twice, reserved label names, a negative counter, and histograms whose
buckets are not cumulative or whose +Inf bucket differs from _count.
"""
import math
import re

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class Error(ValueError):
    def __init__(self, lineno, msg, line=""):
        super().__init__("line %d: %s%s" % (lineno, msg, (": " + line) if line else ""))


class Family:
    def __init__(self, name):
        self.name = name
        self.help = None
        self.type = None
        self.samples = []  # (sample name, {label: value}, float)

    def labels(self):
        """The label names its series use (le/quantile left out), sorted."""
        out = set()
        for _, labels, _ in self.samples:
            out.update(k for k in labels if k not in ("le", "quantile"))
        return sorted(out)


def _unescape(s, lineno, allowed):
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            if i + 1 >= len(s) or s[i + 1] not in allowed:
                raise Error(lineno, "bad escape in %r" % s)
            out.append({"\\": "\\", "n": "\n", '"': '"'}[s[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _float(s, lineno):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise Error(lineno, "not a number: %r" % s)
    return float(s)


def _labels(s, lineno):
    """Parse 'a="x",b="y"' (the text between braces)."""
    labels, i = {}, 0
    while i < len(s):
        m = LABEL.match(s, i)
        if not m:
            raise Error(lineno, "bad label name at %r" % s[i:])
        name = m.group(0)
        if name.startswith("__"):
            raise Error(lineno, "reserved label name %s" % name)
        i = m.end()
        if s[i:i + 2] != '="':
            raise Error(lineno, "want =\" after label %s" % name)
        i += 2
        j = i
        while j < len(s) and s[j] != '"':
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise Error(lineno, "unterminated label value")
        if name in labels:
            raise Error(lineno, "label %s twice" % name)
        labels[name] = _unescape(s[i:j], lineno, '\\n"')
        i = j + 1
        if i < len(s):
            if s[i] != ",":
                raise Error(lineno, "want , between labels")
            i += 1
    return labels


def _family_of(sample, fams, current):
    """The family a sample name belongs to (by the suffixes its type allows)."""
    if current is not None:
        f = fams[current]
        if sample == f.name and f.type in ("counter", "gauge", "untyped", "summary"):
            return f.name
        if f.type == "histogram" and sample in (f.name + "_bucket", f.name + "_sum", f.name + "_count"):
            return f.name
        if f.type == "summary" and sample in (f.name + "_sum", f.name + "_count"):
            return f.name
    return None


def parse(text):
    """{family name: Family}, in order of appearance. Raises Error."""
    if text and not text.endswith("\n"):
        raise Error(0, "the exposition does not end with a newline")
    fams, order, current, closed = {}, [], None, set()
    seen = set()
    for lineno, line in enumerate(text.split("\n")[:-1] if text else [], 1):
        if line == "":
            continue
        if line.startswith("#"):
            m = re.fullmatch(r"# (HELP|TYPE) (\S+)(?: (.*))?", line)
            if not m:
                if re.match(r"#\s*(HELP|TYPE)\b", line):
                    raise Error(lineno, "malformed %s line" % line.split()[1], line)
                continue  # a plain comment
            kind, name, rest = m.group(1), m.group(2), m.group(3)
            if not NAME.fullmatch(name):
                raise Error(lineno, "bad metric name", line)
            if name in closed:
                raise Error(lineno, "%s for %s after its samples" % (kind, name), line)
            if name not in fams:
                fams[name] = Family(name)
                order.append(name)
            f = fams[name]
            if current is not None and current != name:
                closed.add(current)
            current = name
            if kind == "HELP":
                if f.help is not None:
                    raise Error(lineno, "second HELP for %s" % name, line)
                f.help = _unescape(rest or "", lineno, "\\n")
            else:
                if f.type is not None:
                    raise Error(lineno, "second TYPE for %s" % name, line)
                if f.samples:
                    raise Error(lineno, "TYPE for %s after its samples" % name, line)
                if rest not in TYPES:
                    raise Error(lineno, "unknown type %r" % rest, line)
                f.type = rest
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (-?\d+))?", line)
        if not m:
            raise Error(lineno, "not a sample line", line)
        sname, ltext, vtext = m.group(1), m.group(2), m.group(3)
        labels = _labels(ltext, lineno) if ltext else {}
        value = _float(vtext, lineno)
        fname = _family_of(sname, fams, current)
        if fname is None:
            raise Error(lineno, "sample %s does not belong to the family before it (%s)" % (sname, current), line)
        f = fams[fname]
        if f.type is None:
            raise Error(lineno, "sample of %s before its TYPE" % fname, line)
        key = (sname, tuple(sorted(labels.items())))
        if key in seen:
            raise Error(lineno, "series given twice", line)
        seen.add(key)
        if f.type == "histogram" and sname.endswith("_bucket"):
            if "le" not in labels:
                raise Error(lineno, "bucket without le", line)
            _float(labels["le"], lineno)
        elif "le" in labels and f.type == "histogram":
            raise Error(lineno, "le on a sample that is not a bucket", line)
        if f.type == "counter" and not (value >= 0):
            raise Error(lineno, "counter below zero or NaN", line)
        f.samples.append((sname, labels, value))
    for name in order:
        f = fams[name]
        if f.help is None or f.type is None:
            raise Error(0, "%s lacks %s" % (name, "HELP" if f.help is None else "TYPE"))
        if f.type == "histogram":
            _check_histogram(f)
    return {n: fams[n] for n in order}


def _check_histogram(f):
    series = {}
    for sname, labels, value in f.samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        s = series.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if sname.endswith("_bucket"):
            s["buckets"].append((_float(labels["le"], 0), value))
        elif sname.endswith("_sum"):
            s["sum"] = value
        else:
            s["count"] = value
    for rest, s in series.items():
        where = "%s%s" % (f.name, dict(rest) if rest else "")
        if s["count"] is None or s["sum"] is None:
            raise Error(0, "%s: histogram without _sum or _count" % where)
        b = sorted(s["buckets"])
        if not b or b[-1][0] != math.inf:
            raise Error(0, "%s: no +Inf bucket" % where)
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            raise Error(0, "%s: buckets are not cumulative" % where)
        if b[-1][1] != s["count"]:
            raise Error(0, "%s: +Inf bucket %g differs from _count %g" % (where, b[-1][1], s["count"]))


def value(fams, name, sample=None, **labels):
    """The value of the series of family name whose labels include labels;
    sample picks _count/_sum/_bucket of a histogram. None if there is none;
    the sum when several series match."""
    f = fams.get(name)
    if f is None:
        return None
    want = sample or name
    found = [v for s, ls, v in f.samples
             if s == want and all(ls.get(k) == str(x) for k, x in labels.items())]
    return sum(found) if found else None
