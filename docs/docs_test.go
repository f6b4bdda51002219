// Package docs checks that the documentation keeps up with the code.
package docs

import (
	"bytes"
	"encoding/xml"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unicode"
	"unicode/utf8"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/pkg/adapter/wire"
)

// Every error code has a row in the troubleshooting table (issue 6).
func TestTroubleshootingTableHasEveryCode(t *testing.T) {
	data, err := os.ReadFile("troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range errcode.All {
		if !strings.Contains(string(data), "\n| `"+string(c)+"` |") {
			t.Errorf("code %s has no row in docs/troubleshooting.md", c)
		}
	}
}

// [CLI-3] The troubleshooting table has a row for exactly the codes of
// errcode.All, once each, and nothing else.
func TestTroubleshootingTableHasNoStrayRow(t *testing.T) {
	data, err := os.ReadFile("troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(string(data), -1) {
		if seen[m[1]] {
			t.Errorf("code %s has two rows in docs/troubleshooting.md", m[1])
		}
		seen[m[1]] = true
		if !slices.Contains(errcode.All, errcode.Code(m[1])) {
			t.Errorf("docs/troubleshooting.md has a row for %s, which is not in errcode.All", m[1])
		}
	}
}

// dynamicCodes are the places that build a code at run time, each with the
// codes it can build: a package's ok=false answer becomes
// extension-<its code> ([PROTO-4]).
var dynamicCodes = map[string][]string{
	`internal/protocol/protocol.go: "extension-" + string(e.Code)`: prefixed("extension-", wire.Codes),
}

func prefixed(prefix string, codes []wire.Code) []string {
	out := make([]string, len(codes))
	for i, c := range codes {
		out[i] = prefix + string(c)
	}
	return out
}

// [CLI-3] Every error code the code base can produce is in errcode.All (and
// so, by TestTroubleshootingTableHasEveryCode, in the troubleshooting
// table): every errcode constant that a Go file of the module (tests aside)
// uses, every errcode.Code conversion of a literal, and every code that a
// dynamic conversion listed in dynamicCodes can build. A conversion of
// anything else fails the test until it is listed there.
func TestEveryUsedCodeIsListed(t *testing.T) {
	consts := errcodeConstants(t)
	for name, value := range consts {
		if !slices.Contains(errcode.All, errcode.Code(value)) {
			t.Errorf("errcode.%s (%q) is not in errcode.All", name, value)
		}
	}
	used := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "errcode" {
					if v, ok := consts[n.Sel.Name]; ok {
						used[v] = true
					}
				}
			case *ast.CallExpr:
				fun, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || len(n.Args) != 1 {
					return true
				}
				if x, ok := fun.X.(*ast.Ident); !ok || x.Name != "errcode" || fun.Sel.Name != "Code" {
					return true
				}
				if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					used[v] = true
					return true
				}
				key := rel + ": " + render(fset, n.Args[0])
				codes, ok := dynamicCodes[key]
				if !ok {
					t.Errorf("%s: errcode.Code(%s) builds a code at run time; list the codes it can build in dynamicCodes", fset.Position(n.Pos()), render(fset, n.Args[0]))
				}
				for _, c := range codes {
					used[c] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(used) < 20 {
		t.Fatalf("found only %d codes in use; is the walk broken?", len(used))
	}
	for c := range used {
		if !slices.Contains(errcode.All, errcode.Code(c)) {
			t.Errorf("code %q is used in the code base but is not in errcode.All", c)
		}
	}
}

// errcodeConstants returns the Code constants of package errcode by name.
func errcodeConstants(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../internal/errcode/errcode.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Code" {
				continue
			}
			for i, name := range vs.Names {
				v, _ := strconv.Unquote(vs.Values[i].(*ast.BasicLit).Value)
				out[name.Name] = v
			}
		}
	}
	if len(out) != len(errcode.All) {
		t.Fatalf("errcode.go declares %d codes, errcode.All lists %d", len(out), len(errcode.All))
	}
	return out
}

// render prints an expression as Go source.
func render(fset *token.FileSet, e ast.Expr) string {
	var b strings.Builder
	printer.Fprint(&b, fset, e)
	return b.String()
}

// Every relative link of the repository's Markdown pages names an existing
// file, and every #fragment a heading of its page (GitHub's anchors), so
// moving or merging a page cannot leave a dead link behind.
func TestRelativeLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("../*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, pattern := range []string{"*.md", "../examples/*/README.md", "../pkg/*/*.md"} {
		more, _ := filepath.Glob(pattern)
		pages = append(pages, more...)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !slices.Contains(anchors(t, path), frag) {
				t.Errorf("%s: link %q: no heading with that anchor in %s", page, target, path)
			}
		}
	}
}

// anchors returns the GitHub anchors of the headings of a Markdown page, and
// its explicit <a id="…"></a> anchors.
func anchors(t *testing.T, page string) []string {
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range text {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			a = a + "-" + strconv.Itoa(n)
		}
		seen[b.String()]++
		out = append(out, a)
	}
	// Explicit anchors, as docs/spec.md gives each clause.
	for _, m := range htmlAnchor.FindAllStringSubmatch(string(data), -1) {
		out = append(out, m[1])
	}
	return out
}

// htmlAnchor is an explicit anchor in a Markdown page.
var htmlAnchor = regexp.MustCompile(`<a id="([^"]+)"></a>`)

// The service files in contrib/ run serve the way docs/configuration.md
// describes: the systemd user unit stops serve with SIGTERM to serve alone
// (KillMode=mixed; what that relies on is tested in
// internal/cli/testdata/script/serve_stop.txtar), restarts it on failure, and
// passes systemd-analyze verify where that exists; the launchd plist is
// well-formed and runs fm procevent serve.
func TestContribServiceFiles(t *testing.T) {
	unit, err := os.ReadFile("../contrib/systemd/fm-procevent-serve.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"KillMode=mixed", "KillSignal=SIGTERM", "Restart=on-failure", "ExecStart=/opt/firstmate/bin/fm procevent serve", "WantedBy=default.target"} {
		if !regexp.MustCompile("(?m)^" + regexp.QuoteMeta(line) + "$").Match(unit) {
			t.Errorf("the systemd unit has no line %q", line)
		}
	}
	// systemd-analyze makes its working directory in /tmp whatever TMPDIR
	// says; where this user cannot write there (a 0755 /tmp, as on some CI
	// machines for uid 65534) it cannot run at all.
	if analyze, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze is not installed: the unit is checked line by line only")
	} else if syscall.Access("/tmp", 2 /* W_OK */) != nil {
		t.Log("systemd-analyze cannot run here: /tmp is not writable for this user")
	} else {
		// verify wants an executable ExecStart; everything else is checked as shipped.
		p := filepath.Join(t.TempDir(), "fm-procevent-serve.service")
		if err := os.WriteFile(p, []byte(strings.Replace(string(unit), "/opt/firstmate/bin/fm", "/bin/true", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(analyze, "verify", p).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	plist, err := os.ReadFile("../contrib/launchd/dev.firstmate.fm-procevent-serve.plist")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Dict struct {
			Keys  []string `xml:"key"`
			Array struct {
				Strings []string `xml:"string"`
			} `xml:"array"`
		} `xml:"dict"`
	}
	if err := xml.Unmarshal(plist, &doc); err != nil {
		t.Fatalf("the launchd plist is not well-formed: %v", err)
	}
	if args := doc.Dict.Array.Strings; !slices.Equal(args, []string{"/opt/firstmate/bin/fm", "procevent", "serve"}) {
		t.Errorf("the launchd plist runs %q", args)
	}
	for _, k := range []string{"Label", "ProgramArguments", "EnvironmentVariables", "KeepAlive", "ExitTimeOut"} {
		if !slices.Contains(doc.Dict.Keys, k) {
			t.Errorf("the launchd plist has no %s", k)
		}
	}
}

// docs/conformance.md is what scripts/conformance.sh generates from
// docs/spec.md and the tests as committed, and no clause that spec.md defines
// is without a test (so a clause that nothing proves fails here).
func TestConformanceTableIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is missing")
	}
	if err := exec.Command("git", "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git work tree")
	}
	out := filepath.Join(t.TempDir(), "conformance.md")
	cmd := exec.Command("bash", "../scripts/conformance.sh")
	cmd.Env = append(os.Environ(), "OUT="+out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("conformance.sh: %v\n%s", err, msg)
	}
	want, _ := os.ReadFile(out)
	got, _ := os.ReadFile("conformance.md")
	if string(got) != string(want) {
		t.Errorf("docs/conformance.md is stale: run bash scripts/conformance.sh")
	}
	if n := strings.Count(string(want), "**none yet**"); n > 0 {
		t.Errorf("%d clauses of docs/spec.md have no test", n)
	}
	if n, m := strings.Count(string(want), "\n| [`["), len(specClauses(t)); n != m {
		t.Errorf("docs/conformance.md has %d rows, docs/spec.md defines %d clauses", n, m)
	}

	// The table does not depend on the locale of whoever regenerates it: an
	// en_US.UTF-8 collation (which sorts "bind_refusals" before "bind.")
	// gives the same bytes. The locale is compiled here when the system has
	// its source but not the compiled locale.
	locales := t.TempDir()
	if _, err := os.Stat("/usr/share/i18n/locales/en_US"); err != nil {
		t.Log("no en_US locale source; the locale check is skipped")
		return
	}
	if msg, err := exec.Command("localedef", "-i", "en_US", "-f", "UTF-8", filepath.Join(locales, "en_US.UTF-8")).CombinedOutput(); err != nil {
		t.Logf("localedef: %v %s; the locale check is skipped", err, msg)
		return
	}
	cmd = exec.Command("bash", "../scripts/conformance.sh")
	cmd.Env = append(os.Environ(), "OUT="+out, "LOCPATH="+locales, "LC_ALL=en_US.UTF-8")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("conformance.sh under en_US.UTF-8: %v\n%s", err, msg)
	}
	if other, _ := os.ReadFile(out); string(other) != string(want) {
		t.Errorf("conformance.sh writes another table under LC_ALL=en_US.UTF-8")
	}
}

// citedClauses maps each clause id cited in a text file of the repository
// at root to the files (relative to root) that cite it. Every file that
// repoFiles lists is read but binary ones (a NUL byte, or not UTF-8): a
// citation in a shell or Python script, or in an extensionless entrypoint,
// counts as one in Go.
func citedClauses(root string) (map[string][]string, error) {
	files, err := repoFiles(root)
	if err != nil {
		return nil, err
	}
	cited := map[string][]string{}
	for _, rel := range files {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		if bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) {
			continue
		}
		for _, m := range clauseID.FindAllStringSubmatch(string(data), -1) {
			if !slices.Contains(cited[m[1]], rel) {
				cited[m[1]] = append(cited[m[1]], rel)
			}
		}
	}
	return cited, nil
}

// repoFiles lists the regular files of the repository at root, relative to
// it: what `git ls-files` lists in a work tree (so a virtualenv or a tool's
// cache inside the tree is never read; conformance.sh reads the same set),
// else, where git is missing or refuses (a copy of the sources, another
// owner), every file under root but .git.
func repoFiles(root string) ([]string, error) {
	var files []string
	if out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output(); err == nil && len(out) > 0 {
		for _, rel := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
			if fi, err := os.Lstat(filepath.Join(root, rel)); err == nil && fi.Mode().IsRegular() {
				files = append(files, rel)
			}
		}
		return files, nil
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return nil
	})
	return files, err
}

// citedClauses reads every kind of file a citation can hide in: a tree with
// one citation per kind yields each of them, and a binary file none; in a
// git work tree it reads what git lists.
func TestCitedClausesReadsEveryTextFile(t *testing.T) {
	root := t.TempDir()
	// cite spells a citation that this file itself does not hold.
	cite := func(id string) string { return "[" + id + "-1]" }
	files := map[string]string{
		"a.go":                      "// " + cite("GOO") + "\n",
		"b.md":                      cite("MDD") + "\n",
		"c/script/d.txtar":          "# " + cite("TXT") + "\n",
		"e/fake.sh":                 "# " + cite("SHH") + "\n",
		"f/lib/g.py":                "# " + cite("PYY") + "\n",
		"f/bin/firstmate-extension": "#!/usr/bin/env python3\n# " + cite("BIN") + "\n",
		".ci/run":                   "# " + cite("CII") + "\n",
		"h.bin":                     "\x00" + cite("NUL"),
		"i.dat":                     "\xff" + cite("UTF"),
		".git/objects/x":            cite("GIT"),
	}
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cited, err := citedClauses(root)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for id := range cited {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	if want := []string{"BIN-1", "CII-1", "GOO-1", "MDD-1", "PYY-1", "SHH-1", "TXT-1"}; !slices.Equal(ids, want) {
		t.Errorf("cited %v, want %v", ids, want)
	}

	// In a git work tree, only what git lists: not a virtualenv left in it.
	if _, err := exec.LookPath("git"); err != nil {
		return
	}
	work := t.TempDir()
	for name, data := range map[string]string{"k.sh": cite("TRK"), ".venv/lib/l.py": cite("VEN")} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(work, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "k.sh"}} {
		if out, err := exec.Command("git", append([]string{"-C", work}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	cited, err = citedClauses(work)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cited["TRK-1"]; !ok || len(cited) != 1 {
		t.Errorf("in a work tree: cited %v, want only TRK-1", cited)
	}
}

// clauseID is a clause id as code, tests and docs cite it.
var clauseID = regexp.MustCompile(`\[([A-Z]+-[0-9]+)\]`)

// specDefinition is a definition line of docs/spec.md: "- **[ID]**", then
// the anchor that conformance.md links to.
var specDefinition = regexp.MustCompile(`(?m)^- \*\*\[([A-Z]+-[0-9]+)\]\*\* <a id="([a-z0-9-]+)"></a>`)

// specClauses returns the clause ids docs/spec.md defines, in order, failing
// the test on a definition line without its anchor or a duplicate.
func specClauses(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("spec.md")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range regexp.MustCompile(`(?m)^- \*\*\[[^\n]*`).FindAllString(string(data), -1) {
		m := specDefinition.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/spec.md: %.60q is not a definition `- **[ID]** <a id=\"id\"></a>`", line)
			continue
		}
		if m[2] != strings.ToLower(m[1]) {
			t.Errorf("docs/spec.md: [%s] has the anchor %q, want %q", m[1], m[2], strings.ToLower(m[1]))
		}
		if slices.Contains(ids, m[1]) {
			t.Errorf("docs/spec.md defines [%s] twice", m[1])
		}
		ids = append(ids, m[1])
	}
	if len(ids) < 50 {
		t.Fatalf("docs/spec.md defines only %d clauses; is the pattern broken?", len(ids))
	}
	return ids
}

// The project stands on its own: every clause id cited anywhere in
// the repository (Go, Python and shell code, scripts, Markdown pages,
// testscript files; spec.md's own cross-references included) is defined in
// docs/spec.md, and every clause spec.md defines is cited somewhere outside it
// (TestConformanceTableIsCurrent further demands a test for each).
func TestEveryCitedClauseIsDefined(t *testing.T) {
	defined := specClauses(t)
	cited, err := citedClauses("..")
	if err != nil {
		t.Fatal(err)
	}
	if len(cited) < 50 {
		t.Fatalf("found only %d cited clauses; is the walk broken?", len(cited))
	}
	for id, files := range cited {
		if !slices.Contains(defined, id) {
			t.Errorf("[%s] is cited in %s but not defined in docs/spec.md: add a line `- **[%s]** <a id=%q></a>…`",
				id, strings.Join(files, ", "), id, strings.ToLower(id))
		}
	}
	for _, id := range defined {
		if !slices.ContainsFunc(cited[id], func(f string) bool { return f != filepath.Join("docs", "spec.md") }) {
			t.Errorf("docs/spec.md defines [%s], which nothing else cites", id)
		}
	}
}
