"""Label and field selectors with the grammar and errors of the API server."""
import re


class SelectorError(ValueError):
    pass


_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _tokens(s):
    """Lexer: identifiers/values, operators, parentheses, commas."""
    toks = []
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
            continue
        two = s[i:i + 2]
        if two in ("==", "!="):
            toks.append(two)
            i += 2
            continue
        if c in "=!(),<>":
            toks.append(c)
            i += 1
            continue
        j = i
        while j < n and not s[j].isspace() and s[j] not in "=!(),<>":
            j += 1
        toks.append(s[i:j])
        i = j
    return toks


def parse_labels(s):
    """Parse a label selector into a list of (key, op, values)."""
    reqs = []
    if s is None or not s.strip():
        return reqs
    toks = _tokens(s)
    i = 0

    def need(cond, msg):
        if not cond:
            raise SelectorError("unable to parse requirement: " + msg)

    while i < len(toks):
        neg = False
        if toks[i] == "!":
            neg = True
            i += 1
        need(i < len(toks), "found '', expected: identifier")
        key = toks[i]
        need(key not in "=!(),<>" and key not in ("==", "!="),
             "found '%s', expected: !, identifier, or 'end of string'" % key)
        if not _KEY.match(key) or len(key.split("/")[-1]) > 63:
            raise SelectorError("unable to parse requirement: <nil>: Invalid value: \"%s\": "
                                "name part must consist of alphanumeric characters, '-', '_' "
                                "or '.', and must start and end with an alphanumeric character "
                                "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                                "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')" % key)
        i += 1
        if neg:
            reqs.append((key, "!", []))
        elif i >= len(toks) or toks[i] == ",":
            reqs.append((key, "exists", []))
        else:
            op = toks[i]
            i += 1
            if op in ("=", "==", "!="):
                v = ""
                if i < len(toks) and toks[i] not in (",",) and toks[i] not in "=!()<>":
                    v = toks[i]
                    i += 1
                if not _VALUE.match(v) or len(v) > 63:
                    raise SelectorError("unable to parse requirement: values[0][%s]: Invalid "
                                        "value: \"%s\": a valid label must be an empty string "
                                        "or consist of alphanumeric characters, '-', '_' or '.', "
                                        "and must start and end with an alphanumeric character"
                                        % (key, v))
                reqs.append((key, "!=" if op == "!=" else "=", [v]))
            elif op in ("in", "notin"):
                need(i < len(toks) and toks[i] == "(", "found '%s', expected: '('" %
                     (toks[i] if i < len(toks) else ""))
                i += 1
                vals = []
                while True:
                    need(i < len(toks), "found '', expected: ',', ')' or identifier")
                    if toks[i] == ")":
                        i += 1
                        break
                    if toks[i] == ",":
                        vals.append("")
                        i += 1
                        continue
                    vals.append(toks[i])
                    i += 1
                    if i < len(toks) and toks[i] == ",":
                        i += 1
                        if i < len(toks) and toks[i] == ")":
                            vals.append("")
                reqs.append((key, op, vals))
            elif op in ("<", ">"):
                need(i < len(toks), "found '', expected: identifier")
                v = toks[i]
                i += 1
                try:
                    int(v)
                except ValueError:
                    raise SelectorError("unable to parse requirement: for 'Gt', 'Lt' operators, "
                                        "the value must be an integer")
                reqs.append((key, op, [v]))
            else:
                raise SelectorError("unable to parse requirement: found '%s', expected: in, "
                                    "notin, =, ==, !=, gt, lt" % op)
        if i < len(toks):
            need(toks[i] == ",", "found '%s', expected: ',' or 'end of string'" % toks[i])
            i += 1
            need(i < len(toks), "found '', expected: !, identifier, or 'end of string'")
    return reqs


def match_labels(reqs, labels):
    labels = labels or {}
    for key, op, vals in reqs:
        has = key in labels
        v = labels.get(key)
        if op == "exists":
            ok = has
        elif op == "!":
            ok = not has
        elif op == "=" or op == "in":
            ok = has and v in vals
        elif op == "!=" or op == "notin":
            ok = not has or v not in vals
        elif op in ("<", ">"):
            try:
                iv = int(v)
            except (TypeError, ValueError):
                return False
            ok = iv < int(vals[0]) if op == "<" else iv > int(vals[0])
        else:
            ok = False
        if not ok:
            return False
    return True


def _split_unescaped(s, sep):
    out, cur, i = [], [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            cur.append(s[i:i + 2])
            i += 2
            continue
        if c == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


def _unescape(v):
    out, i = [], 0
    while i < len(v):
        if v[i] == "\\":
            if i + 1 >= len(v) or v[i + 1] not in "\\,=":
                raise SelectorError("invalid field selector: invalid escape sequence")
            out.append(v[i + 1])
            i += 2
            continue
        if v[i] in ",=":
            raise SelectorError("invalid field selector: unescaped %s" % v[i])
        out.append(v[i])
        i += 1
    return "".join(out)


def parse_fields(s):
    """Parse a field selector into a list of (field, op, value)."""
    reqs = []
    if s is None or not s.strip():
        return reqs
    for part in _split_unescaped(s, ","):
        if not part:
            continue
        for op in ("!=", "==", "="):
            idx = _find_unescaped(part, op)
            if idx >= 0:
                field = part[:idx].strip()
                value = _unescape(part[idx + len(op):])
                reqs.append((field, "!=" if op == "!=" else "=", value))
                break
        else:
            raise SelectorError("invalid selector: '%s'; can't understand '%s'" % (s, part))
    return reqs


def _find_unescaped(s, op):
    i = 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s.startswith(op, i):
            return i
        i += 1
    return -1


def match_fields(reqs, values):
    """values: dict field -> string value for the object."""
    for field, op, want in reqs:
        got = values.get(field, "")
        if (got == want) != (op == "="):
            return False
    return True
