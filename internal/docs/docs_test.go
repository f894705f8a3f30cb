package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// root is the repository's root, seen from this package's directory.
var root = filepath.Join("..", "..")

// pages are the documents checked: the README and every page of docs/.
func pages(t *testing.T) map[string]string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range append(names, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		out[rel(name)] = string(b)
	}
	return out
}

// rel is path relative to the repository's root, with slashes.
func rel(path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

// A finding is one thing a document says that the repository does not bear out.
type finding struct {
	file string
	line int
	span string // the code span at fault, if one is
	what string
}

func (f finding) String() string {
	if f.span != "" {
		return fmt.Sprintf("%s:%d: `%s`: %s", f.file, f.line, f.span, f.what)
	}
	return fmt.Sprintf("%s:%d: %s", f.file, f.line, f.what)
}

func report(t *testing.T, findings []finding) {
	t.Helper()
	for _, f := range findings {
		t.Error(f)
	}
}

// decls is what the module declares, which is what a document may cite.
type decls struct {
	// pkgs maps a package name to its package-level names: funcs, types, consts and
	// vars. Packages of one name (two main packages) share an entry.
	pkgs map[string]map[string]bool
	// types maps a type name to its declarations, in whichever package: several
	// packages declare an Options.
	types map[string][]*typeDecl
	byPkg map[string]*typeDecl // "pkg.Type"
	// tests are the module's Test, Benchmark, Fuzz and Example functions.
	tests map[string]bool
}

type typeDecl struct {
	pkg string
	// members are the type's methods, struct fields and interface methods.
	members map[string]bool
	// embedded are the types it embeds ("pkg.Type"), whose members it promotes.
	embedded []string
}

var testFunc = regexp.MustCompile(`^(Test|Benchmark|Fuzz|Example)([A-Z0-9_]|$)`)

// loadDecls parses every Go file of the repository (the bench and tools modules too:
// the documents cite their tests), once for all the tests.
var loadDecls = sync.OnceValues(func() (*decls, error) {
	d := &decls{pkgs: map[string]map[string]bool{}, types: map[string][]*typeDecl{}, byPkg: map[string]*typeDecl{}, tests: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir():
			if path == root {
				return nil
			}
			if n := e.Name(); strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "bin" {
				return filepath.SkipDir
			}
			return nil
		case !strings.HasSuffix(path, ".go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		d.add(f, strings.HasSuffix(path, "_test.go"))
		return nil
	})
	return d, err
})

func (d *decls) add(f *ast.File, test bool) {
	pkg := f.Name.Name
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			name := decl.Name.Name
			switch {
			case test:
				// A test file's helpers are not what a document may point a reader at;
				// its tests are.
				if decl.Recv == nil && testFunc.MatchString(name) {
					d.tests[name] = true
				}
			case decl.Recv == nil:
				d.pkg(pkg)[name] = true
			default:
				if _, recv := typeName(pkg, decl.Recv.List[0].Type); recv != "" {
					d.typ(pkg, recv).members[name] = true
				}
			}
		case *ast.GenDecl:
			if test {
				continue
			}
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						d.pkg(pkg)[n.Name] = true
					}
				case *ast.TypeSpec:
					d.pkg(pkg)[spec.Name.Name] = true
					t := d.typ(pkg, spec.Name.Name)
					switch ty := spec.Type.(type) {
					case *ast.StructType:
						t.fields(pkg, ty.Fields)
					case *ast.InterfaceType:
						t.fields(pkg, ty.Methods)
					}
				}
			}
		}
	}
}

func (d *decls) pkg(name string) map[string]bool {
	if d.pkgs[name] == nil {
		d.pkgs[name] = map[string]bool{}
	}
	return d.pkgs[name]
}

func (d *decls) typ(pkg, name string) *typeDecl {
	key := pkg + "." + name
	if t := d.byPkg[key]; t != nil {
		return t
	}
	t := &typeDecl{pkg: pkg, members: map[string]bool{}}
	d.byPkg[key] = t
	d.types[name] = append(d.types[name], t)
	return t
}

func (t *typeDecl) fields(pkg string, list *ast.FieldList) {
	for _, f := range list.List {
		if len(f.Names) == 0 {
			if q, name := typeName(pkg, f.Type); name != "" {
				t.members[name] = true
				t.embedded = append(t.embedded, q+"."+name)
			}
			continue
		}
		for _, n := range f.Names {
			t.members[n.Name] = true
		}
	}
}

// typeName is the package and name of the type expr names (a receiver, an embedded
// field), or "" for a type without one.
func typeName(pkg string, expr ast.Expr) (string, string) {
	switch e := expr.(type) {
	case *ast.Ident:
		return pkg, e.Name
	case *ast.StarExpr:
		return typeName(pkg, e.X)
	case *ast.IndexExpr:
		return typeName(pkg, e.X)
	case *ast.IndexListExpr:
		return typeName(pkg, e.X)
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			return x.Name, e.Sel.Name
		}
	}
	return "", ""
}

// has reports whether t has member m, its own or promoted from what it embeds.
func (d *decls) has(t *typeDecl, m string, depth int) bool {
	if t.members[m] {
		return true
	}
	if depth > 4 {
		return false
	}
	for _, e := range t.embedded {
		if et := d.byPkg[e]; et != nil && d.has(et, m, depth+1) {
			return true
		}
	}
	return false
}

// declared reports whether any package-level name or member is called name.
func (d *decls) declared(name string) bool {
	for _, names := range d.pkgs {
		if names[name] {
			return true
		}
	}
	for _, ts := range d.types {
		for _, t := range ts {
			if t.members[name] {
				return true
			}
		}
	}
	return false
}

// fileExtensions end a span that names a file rather than a Go name: `flags.json`,
// `main.go`.
var fileExtensions = map[string]bool{
	"go": true, "md": true, "lua": true, "sql": true, "json": true, "yaml": true, "yml": true,
	"sh": true, "tar": true, "txt": true, "mod": true, "sum": true, "tpl": true, "html": true,
}

// missing says why parts, a dotted name a document cites (call: written as a call,
// `Func()`), is not declared here; "" when it is, or when it is not a name of this
// module's to check. Only a name qualified by one of the module's packages or types
// is checked, a test's name, or a bare call written `Func()` with a capital letter:
// River's `river.JobSnooze` and `JobRetryTx`, testing's `SetParallelism(16)`, SQL's
// `now()` and Lua's `tostring` are not this module's to declare.
func (d *decls) missing(parts []string, call string, chartValues map[string]bool) string {
	first := parts[0]
	switch {
	case len(parts) == 2 && fileExtensions[parts[1]]:
		return ""
	case chartValues[strings.Join(parts, ".")]:
		return "" // a value of the Helm chart: dispatcher.workers
	}
	if names, ok := d.pkgs[first]; ok && len(parts) > 1 && first != "main" {
		if !names[parts[1]] {
			return fmt.Sprintf("package %s declares no %s", first, parts[1])
		}
		if len(parts) > 2 {
			t := d.byPkg[first+"."+parts[1]]
			if t == nil || !d.has(t, parts[2], 0) {
				return fmt.Sprintf("%s.%s has no member %s", first, parts[1], parts[2])
			}
		}
		return ""
	}
	if ts := d.types[first]; len(ts) > 0 && len(parts) > 1 {
		for _, t := range ts {
			if d.has(t, parts[1], 0) {
				return ""
			}
		}
		return fmt.Sprintf("no type %s of this module has a member %s", first, parts[1])
	}
	if len(parts) == 1 && testFunc.MatchString(first) {
		if !d.tests[first] {
			return fmt.Sprintf("no test of this module is called %s", first)
		}
		return ""
	}
	if len(parts) == 1 && call == "()" && strings.IndexFunc(first, unicode.IsUpper) >= 0 && !d.declared(first) {
		return fmt.Sprintf("no function or method of this module is called %s", first)
	}
	return ""
}

var (
	// codeSpan is an inline code span; goName a span that is a Go name, maybe a call
	// (`Substrate.Find(id)`) or a pointer (`*space.Error`).
	codeSpan = regexp.MustCompile("`([^`]+)`")
	goName   = regexp.MustCompile(`^[*&]?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(.*\))?$`)
)

// prose is md with its fenced code blocks blanked (line breaks kept, so that offsets
// still give line numbers): what is in them is shell, JSON or Go to read, not names
// to look up.
func prose(md string) string {
	lines := strings.SplitAfter(md, "\n")
	in := false
	for i, l := range lines {
		fence := strings.HasPrefix(strings.TrimLeft(l, " "), "```")
		if in || fence {
			lines[i] = strings.Repeat(" ", len(strings.TrimRight(l, "\n"))) + l[len(strings.TrimRight(l, "\n")):]
		}
		if fence {
			in = !in
		}
	}
	return strings.Join(lines, "")
}

func lineAt(text string, offset int) int { return 1 + strings.Count(text[:offset], "\n") }

// undeclared returns every Go name doc (file) cites that the module does not declare.
func (d *decls) undeclared(file, doc string, chartValues map[string]bool) []finding {
	var out []finding
	text := prose(doc)
	for _, m := range codeSpan.FindAllStringSubmatchIndex(text, -1) {
		span := strings.Join(strings.Fields(text[m[2]:m[3]]), " ")
		g := goName.FindStringSubmatch(span)
		if g == nil {
			continue
		}
		if why := d.missing(strings.Split(g[1], "."), g[2], chartValues); why != "" {
			out = append(out, finding{file, lineAt(text, m[0]), span, why})
		}
	}
	return out
}

// chartValues are the dotted paths of the Helm chart's values (`dispatcher.workers`),
// which read like Go names.
func chartValues(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "space-api", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var walk func(prefix string, v map[string]any)
	walk = func(prefix string, v map[string]any) {
		for k, sub := range v {
			out[prefix+k] = true
			if m, ok := sub.(map[string]any); ok {
				walk(prefix+k+".", m)
			}
		}
	}
	walk("", values)
	return out
}

func TestEveryGoNameTheDocsCiteIsDeclared(t *testing.T) {
	t.Parallel()
	d, err := loadDecls()
	if err != nil {
		t.Fatal(err)
	}
	values := chartValues(t)
	for file, doc := range pages(t) {
		for _, f := range d.undeclared(file, doc, values) {
			t.Error(f)
		}
	}
}

func TestANameTheCodeDoesNotDeclareIsReported(t *testing.T) {
	t.Parallel()
	d, err := loadDecls()
	if err != nil {
		t.Fatal(err)
	}
	doc := "The caller's limits come from `Resolver.LimitsFor`, or `flags.Resolver.LimitsFor`,\n" +
		"charged by `admission.Admit` or `Admitter.Refused(c)`; see `TestNoSuchThing` and `NoSuchFunc()`.\n" +
		"```\nResolver.AlsoMissing() in a code block is not read\n```\n"
	var got []string
	for _, f := range d.undeclared("doc.md", doc, nil) {
		got = append(got, f.String())
	}
	want := []string{
		"doc.md:1: `Resolver.LimitsFor`: no type Resolver of this module has a member LimitsFor",
		"doc.md:1: `flags.Resolver.LimitsFor`: flags.Resolver has no member LimitsFor",
		"doc.md:2: `admission.Admit`: package admission declares no Admit",
		"doc.md:2: `Admitter.Refused(c)`: no type Admitter of this module has a member Refused",
		"doc.md:2: `TestNoSuchThing`: no test of this module is called TestNoSuchThing",
		"doc.md:2: `NoSuchFunc()`: no function or method of this module is called NoSuchFunc",
	}
	if !slices.Equal(got, want) {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	t.Run("names that exist, and names that are not this module's, are not", func(t *testing.T) {
		t.Parallel()
		doc := "`Resolver.Resolve`, `flags.Resolver.Resolve`, `Admitter.Charge`, `*space.LimitError`,\n" +
			"`space.Sandbox.Template` (promoted from Shape), `Substrate.Find(id)`, `Main.flags`,\n" +
			"`TestFairQueue`, `ValidateCreate()`, `river.JobSnooze(d)`, `JobRetryTx`, `now()`,\n" +
			"`flags.json`, `dispatcher.workers`, `Retry-After`"
		values := map[string]bool{"dispatcher.workers": true}
		if f := d.undeclared("doc.md", doc, values); len(f) > 0 {
			t.Errorf("findings: %v", f)
		}
	})
}

// heading is one heading of a page: its text and its anchor, as GitHub makes it.
type heading struct{ text, anchor string }

var headingLine = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)

func headings(doc string) []heading {
	var out []heading
	seen := map[string]int{}
	for _, m := range headingLine.FindAllStringSubmatch(prose(doc), -1) {
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, heading{m[1], a})
	}
	return out
}

// anchor is GitHub's anchor for a heading: lower case, spaces to hyphens, every other
// character but letters, digits, '-' and '_' dropped.
func anchor(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// badLinks returns every link of doc (file, a path from the root) that leaves the
// repository, names no file of it, or names a heading its page does not have. read
// reads a file of the repository by its path from the root.
func badLinks(file, doc string, read func(path string) (string, error)) []finding {
	var out []finding
	text := codeSpan.ReplaceAllStringFunc(prose(doc), func(s string) string { return strings.Repeat(" ", len(s)) })
	for _, m := range link.FindAllStringSubmatchIndex(text, -1) {
		target := text[m[2]:m[3]]
		bad := func(format string, args ...any) {
			out = append(out, finding{file, lineAt(text, m[0]), "", fmt.Sprintf("link %s: ", target) + fmt.Sprintf(format, args...)})
		}
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			bad("leaves the repository; name the page in the repository that says it, or the thing in words")
			continue
		}
		path, frag, _ := strings.Cut(target, "#")
		dest := file
		if path != "" {
			dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
			if dest == ".." || strings.HasPrefix(dest, "../") {
				bad("leaves the repository")
				continue
			}
		}
		page, err := read(dest)
		if err != nil {
			bad("no such file in the repository")
			continue
		}
		if frag == "" || !strings.HasSuffix(dest, ".md") {
			continue
		}
		if !slices.ContainsFunc(headings(page), func(h heading) bool { return h.anchor == frag }) {
			bad("%s has no heading #%s", dest, frag)
		}
	}
	return out
}

// readRepo reads a file (or finds a directory) of the repository.
func readRepo(path string) (string, error) {
	full := filepath.Join(root, filepath.FromSlash(path))
	st, err := os.Stat(full)
	if err != nil || st.IsDir() {
		return "", err
	}
	b, err := os.ReadFile(full)
	return string(b), err
}

func TestEveryLinkInTheDocsStaysInTheRepositoryAndLands(t *testing.T) {
	t.Parallel()
	for file, doc := range pages(t) {
		report(t, badLinks(file, doc, readRepo))
	}

	t.Run("a link out, to a missing file or to a missing heading is reported", func(t *testing.T) {
		t.Parallel()
		files := map[string]string{"docs/a.md": "# A\n\n## The part\n"}
		read := func(p string) (string, error) {
			if s, ok := files[p]; ok {
				return s, nil
			}
			return "", fs.ErrNotExist
		}
		doc := "[ok](a.md#the-part) [here](#b) [out](https://example.com/x) [up](../../elsewhere/x.md)\n" +
			"[gone](gone.md) [no heading](a.md#nope) `[in code](https://example.com)`\n\n# B\n"
		files["docs/b.md"] = doc
		var got []string
		for _, f := range badLinks("docs/b.md", doc, read) {
			got = append(got, f.String())
		}
		want := []string{
			"docs/b.md:1: link https://example.com/x: leaves the repository; name the page in the repository that says it, or the thing in words",
			"docs/b.md:1: link ../../elsewhere/x.md: leaves the repository",
			"docs/b.md:2: link gone.md: no such file in the repository",
			"docs/b.md:2: link a.md#nope: docs/a.md has no heading #nope",
		}
		if !slices.Equal(got, want) {
			t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

var (
	// sectionRef is a citation of a section of a page of docs/: `docs/design.md,
	// "Warm pool"`. continuation joins a citation broken over comment lines.
	sectionRef   = regexp.MustCompile(`docs/([a-z0-9_-]+)\.md,\s+"([^"]+)"`)
	continuation = regexp.MustCompile(`[ \t]*\n[ \t]*(?://+|--|#+)?[ \t]*`)
	// pageRef is where a citation starts: joining lines moves it, never adds or drops
	// one, so the n-th of the joined text is the n-th of the file.
	pageRef = regexp.MustCompile(`docs/[a-z0-9_-]+\.md,`)
)

// citingFiles are the files whose text may cite a section of docs/: code, comments,
// migrations, scripts, the chart and the documents themselves.
var citingFiles = map[string]bool{
	".go": true, ".lua": true, ".sql": true, ".sh": true, ".yaml": true, ".yml": true,
	".tpl": true, ".json": true, ".md": true,
}

// missingSections returns every section citation of text (file) that names no heading
// of its page; headingsOf returns a page's headings, false when there is no such page.
func missingSections(file, text string, headingsOf func(page string) ([]heading, bool)) []finding {
	var out []finding
	joined := continuation.ReplaceAllString(text, " ")
	starts, joinedStarts := pageRef.FindAllStringIndex(text, -1), pageRef.FindAllStringIndex(joined, -1)
	for _, m := range sectionRef.FindAllStringSubmatchIndex(joined, -1) {
		page, section := "docs/"+joined[m[2]:m[3]]+".md", joined[m[4]:m[5]]
		line := 0
		if n := slices.IndexFunc(joinedStarts, func(s []int) bool { return s[0] == m[0] }); n >= 0 && n < len(starts) {
			line = lineAt(text, starts[n][0])
		}
		hs, ok := headingsOf(page)
		if !ok {
			out = append(out, finding{file, line, "", fmt.Sprintf("cites %s, which does not exist", page)})
			continue
		}
		if !slices.ContainsFunc(hs, func(h heading) bool { return strings.ReplaceAll(h.text, "`", "") == section }) {
			out = append(out, finding{file, line, "", fmt.Sprintf("cites %s, %q, which is not a heading of it", page, section)})
		}
	}
	return out
}

func TestEveryDocsSectionTheRepositoryCitesIsAHeading(t *testing.T) {
	t.Parallel()
	docs := pages(t)
	headingsOf := func(page string) ([]heading, bool) {
		doc, ok := docs[page]
		return headings(doc), ok
	}
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir():
			if n := e.Name(); path != root && (strings.HasPrefix(n, ".") || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		case !citingFiles[filepath.Ext(path)], rel(path) == "internal/docs/docs_test.go":
			// This file's examples cite missing sections on purpose.
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		report(t, missingSections(rel(path), string(b), headingsOf))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a citation of a missing section or page is reported, across comment lines too", func(t *testing.T) {
		t.Parallel()
		headingsOf := func(page string) ([]heading, bool) {
			if page != "docs/design.md" {
				return nil, false
			}
			return headings("# Design\n\n## The create path\n\n## Admission buckets\n"), true
		}
		text := "// see docs/design.md, \"The create path\", and (docs/design.md, \"Admission\n" +
			"// buckets\"); not docs/design.md, \"Recovery\", nor docs/gone.md, \"Anything\"\n"
		var got []string
		for _, f := range missingSections("x.go", text, headingsOf) {
			got = append(got, f.String())
		}
		want := []string{
			`x.go:2: cites docs/design.md, "Recovery", which is not a heading of it`,
			"x.go:2: cites docs/gone.md, which does not exist",
		}
		if !slices.Equal(got, want) {
			t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// glossaryRow is a row of the glossary's table in docs/design.md: its word, and the
// names in its last two columns.
var glossaryRow = regexp.MustCompile("(?m)^\\| ([a-z ]+) \\|[^|]+\\|([^|]*)\\|([^|]*)\\|$")

func TestTheGlossaryIsTheCodesVocabulary(t *testing.T) {
	t.Parallel()
	d, err := loadDecls()
	if err != nil {
		t.Fatal(err)
	}
	design := pages(t)["docs/design.md"]
	at := strings.Index(design, "\n## Glossary\n")
	if at < 0 {
		t.Fatal("docs/design.md has no Glossary section")
	}
	section := design[at+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	rows := glossaryRow.FindAllStringSubmatch(section, -1)
	if len(rows) < 10 {
		t.Fatalf("%d glossary rows, want the table's", len(rows))
	}
	words := map[string]bool{}
	for _, row := range rows[1:] { // the header's "word" row first
		word := row[1]
		if words[word] {
			t.Errorf("the glossary defines %q twice", word)
		}
		words[word] = true
		if len(codeSpan.FindAllString(row[2], -1)) == 0 {
			t.Errorf("%q: no name in the code is given for it", word)
		}
		for _, m := range codeSpan.FindAllStringSubmatch(row[3], -1) {
			if d.declared(m[1]) {
				t.Errorf("%q: the code declares %s again, a retired name for it", word, m[1])
			}
		}
	}
}
