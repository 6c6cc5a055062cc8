// Command gkm-chart-render renders a Helm 3 chart the way `helm template`
// does, for tests and for `make manifests` on machines without Helm.
//
// Helm's template language is Go's text/template with the sprig functions;
// this program adds the Helm built-ins charts use (include, tpl, toYaml,
// fromYaml, fromJson, required, lookup, .Values, .Release, .Chart, .Files,
// .Capabilities, .Template) and Helm's value handling (values.yaml, then -f
// files, then --set / --set-string, with null deleting a key). Output is a
// multi-document YAML stream with "# Source:" comments, in Helm's install
// order. Any template error, invalid YAML, or bad flag exits 1 with a message
// on stderr that names the template and line.
//
// It is a test tool: lookup always finds nothing (as in `helm template`), and
// only the parts of Helm the gkm chart can use are here.
package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func die(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "gkm-chart-render: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	var valueFiles, sets, setStrings, apiVersions listFlag
	release := flag.String("release", "gkm", "release name (.Release.Name)")
	namespace := flag.String("namespace", "default", "release namespace (.Release.Namespace)")
	includeCRDs := flag.Bool("include-crds", false, "print crds/*.yaml first, as helm template --include-crds")
	createNS := flag.Bool("create-namespace", false, "print a Namespace object for --namespace first (for plain-YAML installs)")
	strict := flag.Bool("strict", false, "fail on a reference to a missing value (missingkey=error)")
	notes := flag.Bool("notes", false, "print the rendered NOTES.txt on stderr")
	kubeVersion := flag.String("kube-version", "v1.28.0", "Kubernetes version for .Capabilities.KubeVersion, as helm template --kube-version")
	flag.Var(&valueFiles, "f", "values file (repeatable; later wins)")
	flag.Var(&sets, "set", "set a value: a.b=c,x[0]=y,list={a,b} (repeatable)")
	flag.Var(&setStrings, "set-string", "set a value as a string (repeatable)")
	flag.Var(&apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions.Has (repeatable)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: gkm-chart-render [flags] CHART_DIR\n")
		flag.PrintDefaults()
	}
	// flags may come before or after the chart directory, as with helm
	var positional []string
	for args := os.Args[1:]; ; {
		if err := flag.CommandLine.Parse(args); err != nil {
			os.Exit(2)
		}
		if flag.NArg() == 0 {
			break
		}
		positional = append(positional, flag.Arg(0))
		args = flag.Args()[1:]
	}
	if len(positional) != 1 {
		flag.Usage()
		os.Exit(2)
	}
	out, notesText, err := render(positional[0], options{
		release: *release, namespace: *namespace, valueFiles: valueFiles,
		sets: sets, setStrings: setStrings, apiVersions: apiVersions,
		includeCRDs: *includeCRDs, strict: *strict, createNamespace: *createNS,
		kubeVersion: *kubeVersion,
	})
	if err != nil {
		die("%v", err)
	}
	if _, err := os.Stdout.WriteString(out); err != nil {
		die("writing output: %v", err)
	}
	if *notes && notesText != "" {
		fmt.Fprintln(os.Stderr, notesText)
	}
}

type options struct {
	release, namespace, kubeVersion           string
	valueFiles, sets, setStrings, apiVersions []string
	includeCRDs, strict, createNamespace      bool
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func render(chartDir string, o options) (string, string, error) {
	if !dns1123.MatchString(o.release) || len(o.release) > 53 {
		return "", "", fmt.Errorf("release name %q: must be a DNS-1123 label of at most 53 characters", o.release)
	}
	if !dns1123.MatchString(o.namespace) || len(o.namespace) > 63 {
		return "", "", fmt.Errorf("namespace %q: must be a DNS-1123 label", o.namespace)
	}
	chart, err := loadChart(chartDir)
	if err != nil {
		return "", "", err
	}
	values, err := loadValues(chartDir, o)
	if err != nil {
		return "", "", err
	}
	files, err := loadFiles(chartDir)
	if err != nil {
		return "", "", err
	}
	name := chart["Name"].(string)
	top := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Files":  files,
		"Release": map[string]interface{}{
			"Name": o.release, "Namespace": o.namespace, "Service": "Helm",
			"Revision": 1, "IsInstall": true, "IsUpgrade": false,
		},
		"Capabilities": capabilities(o.apiVersions, o.kubeVersion),
		"Template":     map[string]interface{}{"Name": "", "BasePath": name + "/templates"},
	}

	tpl, names, err := parseTemplates(chartDir, name, o.strict)
	if err != nil {
		return "", "", err
	}
	var docs []manifest
	notesText := ""
	for _, tname := range names {
		base := path.Base(tname)
		if strings.HasPrefix(base, "_") {
			continue // partials only define templates
		}
		data := copyTop(top, tname)
		var buf bytes.Buffer
		if err := tpl.ExecuteTemplate(&buf, tname, data); err != nil {
			return "", "", cleanError(err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if base == "NOTES.txt" {
			notesText = text
			continue
		}
		if ext := path.Ext(base); ext != ".yaml" && ext != ".yml" && ext != ".tpl" {
			continue
		}
		split, err := splitManifests(tname, text)
		if err != nil {
			return "", "", err
		}
		docs = append(docs, split...)
	}
	sort.SliceStable(docs, func(i, j int) bool { return kindRank(docs[i].kind) < kindRank(docs[j].kind) })

	var out strings.Builder
	if o.createNamespace {
		fmt.Fprintf(&out, "---\n# Source: %s (--create-namespace)\napiVersion: v1\nkind: Namespace\n"+
			"metadata:\n  name: %s\n", name, o.namespace)
	}
	if o.includeCRDs {
		crds, err := crdDocs(chartDir, name)
		if err != nil {
			return "", "", err
		}
		out.WriteString(crds)
	}
	for _, d := range docs {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", d.source, d.body)
	}
	return out.String(), notesText, nil
}

// cleanError turns Go's nested "template: x: executing ... error calling
// include: ... error calling fail: msg" into Helm's short form, so the user
// reads the chart's own message and where it was raised.
func cleanError(err error) error {
	s := err.Error()
	for _, marker := range []string{"error calling fail: ", "error calling required: "} {
		i := strings.LastIndex(s, marker)
		if i < 0 {
			continue
		}
		locs := errLoc.FindAllStringSubmatch(s[:i], -1)
		if len(locs) == 0 {
			break
		}
		return fmt.Errorf("execution error at (%s): %s", locs[len(locs)-1][1], s[i+len(marker):])
	}
	return err
}

var errLoc = regexp.MustCompile(`template: ([^:\s]+:\d+:\d+): executing`)

func copyTop(top map[string]interface{}, tname string) map[string]interface{} {
	data := make(map[string]interface{}, len(top))
	for k, v := range top {
		data[k] = v
	}
	t := top["Template"].(map[string]interface{})
	data["Template"] = map[string]interface{}{"Name": tname, "BasePath": t["BasePath"]}
	return data
}

// ---- chart, values, files ----

func readYAMLMap(file string) (map[string]interface{}, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	return m, nil
}

func loadChart(dir string) (map[string]interface{}, error) {
	raw, err := readYAMLMap(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, fmt.Errorf("not a chart: %v", err)
	}
	if raw["apiVersion"] != "v2" {
		return nil, fmt.Errorf("Chart.yaml: apiVersion must be v2 (Helm 3), got %v", raw["apiVersion"])
	}
	for _, k := range []string{"name", "version"} {
		if s, _ := raw[k].(string); s == "" {
			return nil, fmt.Errorf("Chart.yaml: %s is required", k)
		}
	}
	// .Chart fields are Helm's chart.Metadata names (capitalised).
	chart := map[string]interface{}{}
	for k, v := range raw {
		chart[strings.ToUpper(k[:1])+k[1:]] = v
	}
	for _, k := range []string{"AppVersion", "Description", "Type", "KubeVersion", "Home", "Icon"} {
		if _, ok := chart[k]; !ok {
			chart[k] = ""
		}
	}
	return chart, nil
}

func loadValues(dir string, o options) (map[string]interface{}, error) {
	vals, err := readYAMLMap(filepath.Join(dir, "values.yaml"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	for _, f := range o.valueFiles {
		over, err := readYAMLMap(f)
		if err != nil {
			return nil, fmt.Errorf("values file: %v", err)
		}
		mergeValues(vals, over)
	}
	for _, s := range o.sets {
		if err := parseSet(vals, s, true); err != nil {
			return nil, fmt.Errorf("--set %s: %v", s, err)
		}
	}
	for _, s := range o.setStrings {
		if err := parseSet(vals, s, false); err != nil {
			return nil, fmt.Errorf("--set-string %s: %v", s, err)
		}
	}
	return vals, nil
}

// mergeValues applies over onto dst as Helm coalesces user values: maps
// merge key by key, anything else replaces, and null deletes the key.
func mergeValues(dst, over map[string]interface{}) {
	for k, v := range over {
		if v == nil {
			delete(dst, k)
			continue
		}
		if om, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				mergeValues(dm, om)
				continue
			}
		}
		dst[k] = v
	}
}

// files is .Files: every chart file outside templates/ and the special ones.
type files map[string][]byte

func (f files) Get(name string) string      { return string(f[name]) }
func (f files) GetBytes(name string) []byte { return f[name] }

func (f files) Glob(pattern string) (files, error) {
	out := files{}
	for name, b := range f {
		ok, err := path.Match(pattern, name)
		if err != nil {
			return nil, fmt.Errorf("Files.Glob %q: %v", pattern, err)
		}
		if ok {
			out[name] = b
		}
	}
	return out, nil
}

func (f files) Lines(name string) []string {
	s := string(f[name])
	if s == "" {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

func (f files) AsConfig() (string, error) {
	m := map[string]interface{}{}
	for name, b := range f {
		m[path.Base(name)] = string(b)
	}
	return toYAML(m)
}

func (f files) AsSecrets() (string, error) {
	m := map[string]interface{}{}
	for name, b := range f {
		m[path.Base(name)] = base64.StdEncoding.EncodeToString(b)
	}
	return toYAML(m)
}

func loadFiles(dir string) (files, error) {
	ignore := []string{".git/"}
	if b, err := os.ReadFile(filepath.Join(dir, ".helmignore")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if l != "" && !strings.HasPrefix(l, "#") {
				ignore = append(ignore, l)
			}
		}
	}
	special := map[string]bool{"Chart.yaml": true, "values.yaml": true, "values.schema.json": true,
		"Chart.lock": true, ".helmignore": true}
	out := files{}
	err := walkChart(dir, "", func(rel, p string, isDir bool) (bool, error) {
		if isDir {
			return rel == "templates" || rel == "charts" || ignored(ignore, rel+"/"), nil
		}
		if special[rel] || ignored(ignore, rel) {
			return false, nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return false, err
		}
		out[rel] = b
		return false, nil
	})
	return out, err
}

// walkChart calls fn for everything below dir (rel: slash-separated path
// from the walk's start), following symbolic links as Helm's loader does, so
// a chart may link to files kept elsewhere in its repository. fn returns
// true to skip a directory. A link cycle is an error.
func walkChart(dir, rel string, fn func(rel, path string, isDir bool) (bool, error)) error {
	return walkChartIn(dir, rel, fn, map[string]bool{})
}

func walkChartIn(dir, rel string, fn func(rel, path string, isDir bool) (bool, error),
	onPath map[string]bool) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	if onPath[real] {
		return fmt.Errorf("%s: symbolic link cycle", dir)
	}
	onPath[real] = true
	defer delete(onPath, real)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		r := e.Name()
		if rel != "" {
			r = rel + "/" + e.Name()
		}
		info, err := os.Stat(p) // follows links
		if err != nil {
			return fmt.Errorf("%s: %v", p, err)
		}
		skip, err := fn(r, p, info.IsDir())
		if err != nil {
			return err
		}
		if info.IsDir() && !skip {
			if err := walkChartIn(p, r, fn, onPath); err != nil {
				return err
			}
		}
	}
	return nil
}

// ignored matches the simple .helmignore forms: "dir/", "*.ext", "name".
func ignored(patterns []string, rel string) bool {
	for _, p := range patterns {
		if strings.HasSuffix(p, "/") {
			if strings.HasSuffix(rel, "/") && (rel == p || strings.HasSuffix(rel, "/"+p)) {
				return true
			}
			continue
		}
		if ok, _ := path.Match(p, path.Base(rel)); ok {
			return true
		}
		if ok, _ := path.Match(p, rel); ok {
			return true
		}
	}
	return false
}

// ---- --set ----

// parseSet applies one --set argument: comma-separated key=value pairs, keys
// with "." nesting and [N] list indexes, values {a,b} for lists; "\" escapes
// the next character. typed: true/false/null and integers become typed values.
func parseSet(vals map[string]interface{}, arg string, typed bool) error {
	for _, pair := range splitEscaped(arg, ',', true) {
		eq := indexUnescaped(pair, '=')
		if eq < 0 {
			return fmt.Errorf("%q: key without a value (want key=value)", pair)
		}
		key, raw := pair[:eq], pair[eq+1:]
		var v interface{}
		if strings.HasPrefix(raw, "{") && strings.HasSuffix(raw, "}") {
			items := []interface{}{}
			if inner := raw[1 : len(raw)-1]; inner != "" {
				for _, it := range splitEscaped(inner, ',', false) {
					items = append(items, typedValue(unescape(it), typed))
				}
			}
			v = items
		} else {
			v = typedValue(unescape(raw), typed)
		}
		if err := setPath(vals, key, v); err != nil {
			return err
		}
	}
	return nil
}

func typedValue(s string, typed bool) interface{} {
	if !typed {
		return s
	}
	switch s {
	case "true":
		return true
	case "false":
		return false
	case "null":
		return nil
	}
	if s != "0" && strings.HasPrefix(s, "0") {
		return s // leading zeros stay a string, as in Helm
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n
	}
	return s
}

var segRe = regexp.MustCompile(`^((?:[^\[\]\\]|\\.)+)((?:\[\d+\])*)$`)
var idxRe = regexp.MustCompile(`\[(\d+)\]`)

func setPath(vals map[string]interface{}, key string, v interface{}) error {
	return setIn(vals, splitEscaped(key, '.', true), key, v)
}

// setIn sets the value at segs (a.b[0].c) inside m, creating what is missing.
func setIn(m map[string]interface{}, segs []string, key string, v interface{}) error {
	sm := segRe.FindStringSubmatch(segs[0])
	if sm == nil {
		return fmt.Errorf("bad key %q (at %q)", key, segs[0])
	}
	name := unescape(sm[1])
	var idx []int
	for _, im := range idxRe.FindAllStringSubmatch(sm[2], -1) {
		n, err := strconv.Atoi(im[1])
		if err != nil || n > 65535 {
			return fmt.Errorf("bad list index in %q", key)
		}
		idx = append(idx, n)
	}
	rest := segs[1:]
	if len(idx) > 0 {
		list, err := setInList(m[name], idx, rest, key, v)
		m[name] = list
		return err
	}
	if len(rest) == 0 {
		if v == nil {
			delete(m, name)
		} else {
			m[name] = v
		}
		return nil
	}
	next, ok := m[name].(map[string]interface{})
	if !ok {
		next = map[string]interface{}{}
		m[name] = next
	}
	return setIn(next, rest, key, v)
}

func setInList(cur interface{}, idx []int, rest []string, key string, v interface{}) ([]interface{}, error) {
	list, _ := cur.([]interface{})
	n := idx[0]
	for len(list) <= n {
		list = append(list, nil)
	}
	if len(idx) > 1 {
		inner, err := setInList(list[n], idx[1:], rest, key, v)
		list[n] = inner
		return list, err
	}
	if len(rest) == 0 {
		list[n] = v
		return list, nil
	}
	next, ok := list[n].(map[string]interface{})
	if !ok {
		next = map[string]interface{}{}
		list[n] = next
	}
	return list, setIn(next, rest, key, v)
}

func splitEscaped(s string, sep byte, keepEscapes bool) []string {
	var parts []string
	var cur strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) {
			cur.WriteByte(c)
			cur.WriteByte(s[i+1])
			i++
			continue
		}
		if c == '{' {
			depth++
		} else if c == '}' && depth > 0 {
			depth--
		}
		if c == sep && depth == 0 {
			parts = append(parts, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(c)
	}
	parts = append(parts, cur.String())
	return parts
}

func indexUnescaped(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			continue
		}
		if s[i] == c {
			return i
		}
	}
	return -1
}

func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ---- capabilities ----

type apiVersions []string

func (a apiVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

var kubeVersionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)$`)

func capabilities(extra []string, kubeVersion string) map[string]interface{} {
	builtin := []string{"v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
		"admissionregistration.k8s.io/v1", "apiextensions.k8s.io/v1", "storage.k8s.io/v1",
		"coordination.k8s.io/v1", "events.k8s.io/v1", "networking.k8s.io/v1",
		"scheduling.k8s.io/v1", "node.k8s.io/v1", "discovery.k8s.io/v1", "autoscaling/v2"}
	// "group/version/Kind" forms are accepted too, as Helm does
	return map[string]interface{}{
		"APIVersions": apiVersions(append(builtin, extra...)),
		"KubeVersion": kubeVersionOf(kubeVersion),
		"HelmVersion": map[string]interface{}{"Version": "v3.14.0"},
	}
}

// kubeVersionOf is .Capabilities.KubeVersion for "v1.33.0" (or "1.33.0");
// the default for anything else.
func kubeVersionOf(v string) map[string]interface{} {
	m := kubeVersionRE.FindStringSubmatch(v)
	if m == nil {
		m = []string{"v1.28.0", "1", "28", "0"}
	}
	full := fmt.Sprintf("v%s.%s.%s", m[1], m[2], m[3])
	return map[string]interface{}{"Version": full, "Major": m[1], "Minor": m[2], "GitVersion": full}
}

// ---- templates ----

const maxIncludeDepth = 1000

func parseTemplates(chartDir, chartName string, strict bool) (*template.Template, []string, error) {
	root := template.New("gkm-chart")
	if strict {
		root.Option("missingkey=error")
	} else {
		root.Option("missingkey=zero")
	}
	root.Funcs(funcMap(root))
	var names []string
	tdir := filepath.Join(chartDir, "templates")
	err := walkChart(tdir, "", func(rel, p string, isDir bool) (bool, error) {
		if isDir {
			return false, nil
		}
		name := chartName + "/templates/" + rel
		b, err := os.ReadFile(p)
		if err != nil {
			return false, err
		}
		if _, err := root.New(name).Parse(string(b)); err != nil {
			return false, fmt.Errorf("parse error: %v", err)
		}
		names = append(names, name)
		return false, nil
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(names)
	return root, names, nil
}

func funcMap(root *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	// Helm leaves these out: a chart must not read the renderer's environment.
	delete(f, "env")
	delete(f, "expandenv")
	depth := 0
	f["include"] = func(name string, data interface{}) (string, error) {
		if depth >= maxIncludeDepth {
			return "", fmt.Errorf("include %q: nested too deep (recursive template?)", name)
		}
		depth++
		defer func() { depth-- }()
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	f["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	f["toYaml"] = func(v interface{}) string {
		s, err := toYAML(v)
		if err != nil {
			return "" // Helm's toYaml swallows errors the same way
		}
		return s
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []interface{} {
		var a []interface{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			return []interface{}{err.Error()}
		}
		return a
	}
	f["fromJson"] = f["fromYaml"] // JSON is YAML; same Error-key convention as Helm
	f["lookup"] = func(apiVersion, kind, namespace, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil // no cluster, as with helm template
	}
	return f
}

func toYAML(v interface{}) (string, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// ---- output ----

type manifest struct {
	source, kind, body string
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitManifests cuts a rendered file into its documents, drops empty ones,
// and checks that each is YAML with a kind (as Helm does before installing).
func splitManifests(source, text string) ([]manifest, error) {
	var out []manifest
	for _, part := range docSep.Split(text, -1) {
		body := strings.TrimSpace(part)
		if body == "" || onlyComments(body) {
			continue
		}
		var obj map[string]interface{}
		dec := yaml.NewDecoder(strings.NewReader(body))
		if err := dec.Decode(&obj); err != nil {
			return nil, fmt.Errorf("YAML parse error on %s: %v\n%s", source, err, numbered(body))
		}
		if err := dec.Decode(&map[string]interface{}{}); err != io.EOF {
			return nil, fmt.Errorf("YAML parse error on %s: more than one document in a part", source)
		}
		kind, _ := obj["kind"].(string)
		if kind == "" {
			return nil, fmt.Errorf("%s: a document has no kind\n%s", source, numbered(body))
		}
		out = append(out, manifest{source: source, kind: kind, body: body})
	}
	return out, nil
}

func onlyComments(s string) bool {
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d | %s\n", i+1, l)
	}
	return b.String()
}

// Helm's install order (releaseutil.InstallOrder); other kinds go last.
var installOrder = []string{"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota",
	"LimitRange", "PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret",
	"SecretList", "ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService"}

func kindRank(kind string) int {
	for i, k := range installOrder {
		if k == kind {
			return i
		}
	}
	return len(installOrder)
}

func crdDocs(chartDir, chartName string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	if err != nil {
		return "", err
	}
	sort.Strings(matches)
	var out strings.Builder
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			return "", err
		}
		source := chartName + "/crds/" + filepath.Base(m)
		docs, err := splitManifests(source, string(b))
		if err != nil {
			return "", err
		}
		for _, d := range docs {
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", d.source, d.body)
		}
	}
	return out.String(), nil
}
