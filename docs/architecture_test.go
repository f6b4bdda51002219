package docs

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

const modulePath = "firstmate.dev/fm"

// modulePackages maps each importable package of the module under cmd/,
// internal/, pkg/, bench/ and examples/ (relative path) to the module
// packages its non-test files import, as go/build sees them for this
// platform. It reads the sources, so it needs no go command and no module
// cache (the unprivileged run has neither).
func modulePackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	imports := map[string][]string{}
	for _, top := range []string{"cmd", "internal", "pkg", "bench", "examples"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") {
				return filepath.SkipDir
			}
			pkg, err := build.Default.ImportDir(p, 0)
			if err != nil || len(pkg.GoFiles) == 0 {
				return nil // no package here, or tests only
			}
			rel, _ := filepath.Rel(root, p)
			var deps []string
			for _, imp := range pkg.Imports {
				if dep, ok := strings.CutPrefix(imp, modulePath+"/"); ok {
					deps = append(deps, dep)
				}
			}
			imports[filepath.ToSlash(rel)] = deps
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return imports
}

// architectureRow is one row of the package table of architecture.md.
type architectureRow struct {
	callers string // the third column, as written
	line    int    // its line in architecture.md: rows further down are lower layers
}

// architectureTable reads the table under "## Packages" of architecture.md:
// package path (first column, in backquotes) to its row.
func architectureTable(t *testing.T) map[string]architectureRow {
	t.Helper()
	data, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]architectureRow{}
	in := false
	row := regexp.MustCompile("^\\| `([^`]+)` \\|(.*)\\|(.*)\\|\\s*$")
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.HasPrefix(line, "## Packages")
		case in:
			if m := row.FindStringSubmatch(line); m != nil {
				if _, dup := rows[m[1]]; dup {
					t.Errorf("architecture.md:%d: package %s has two rows", i+1, m[1])
				}
				rows[m[1]] = architectureRow{callers: m[3], line: i + 1}
			}
		}
	}
	if len(rows) == 0 {
		t.Fatal("architecture.md: no package table under ## Packages")
	}
	return rows
}

// outsideLayers are the rows the downward rule does not bind: test fixtures,
// and the public packages under pkg/, which import host internals today
// (architecture.md says which; the SDK is to import none).
func outsideLayers(pkg string) bool {
	return strings.HasPrefix(pkg, "pkg/") || pkg == "internal/testpkg" || pkg == "internal/reliability" || pkg == "internal/powercut"
}

// namedCallers are the backquoted names of a callers column: a package path
// (`internal/cli`) or a folder ending in a slash (`bench/`, `examples/`).
func namedCallers(column string) []string {
	var names []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(column, -1) {
		names = append(names, m[1])
	}
	return names
}

// openCallers reports whether a callers column admits any importer ("any
// package", "every package" without a list after it).
func openCallers(column string) bool {
	return strings.Contains(column, "any package") ||
		(strings.Contains(column, "every package") && !strings.Contains(column, ":"))
}

// The package table of docs/architecture.md is the imports as they are: every
// package of cmd/, internal/ and pkg/ has a row, every module package that
// imports it is named among its callers (or the row admits any caller),
// every package named as a caller does import it, and a package imports only
// packages whose rows stand below its own (but outsideLayers).
func TestArchitectureTableMatchesImports(t *testing.T) {
	imports := modulePackages(t, "..")
	rows := architectureTable(t)
	importers := map[string][]string{}
	for pkg, deps := range imports {
		for _, dep := range deps {
			importers[dep] = append(importers[dep], pkg)
		}
	}
	var pkgs []string
	for pkg := range imports {
		pkgs = append(pkgs, pkg)
	}
	sort.Strings(pkgs)
	for _, pkg := range pkgs {
		if strings.HasPrefix(pkg, "bench/") || strings.HasPrefix(pkg, "examples/") {
			continue
		}
		if _, ok := rows[pkg]; !ok {
			t.Errorf("architecture.md: package %s has no row in the package table", pkg)
		}
	}
	for pkg, row := range rows {
		if _, ok := imports[pkg]; !ok {
			t.Errorf("architecture.md:%d: %s is not a package of the module", row.line, pkg)
			continue
		}
		named := namedCallers(row.callers)
		covered := func(caller string) bool {
			for _, n := range named {
				if n == caller || (strings.HasSuffix(n, "/") && strings.HasPrefix(caller, n)) {
					return true
				}
			}
			return false
		}
		if !openCallers(row.callers) {
			for _, caller := range importers[pkg] {
				if !covered(caller) {
					t.Errorf("architecture.md:%d: %s imports %s but is not among its callers", row.line, caller, pkg)
				}
			}
		}
		for _, n := range named {
			if _, isPkg := imports[n]; isPkg && !slices.Contains(importers[pkg], n) {
				t.Errorf("architecture.md:%d: %s is named as a caller of %s but does not import it", row.line, n, pkg)
			}
		}
		for _, dep := range imports[pkg] {
			if below, ok := rows[dep]; ok && below.line < row.line && !outsideLayers(pkg) {
				t.Errorf("architecture.md:%d: %s imports %s, whose row stands above it (imports point down the table)", row.line, pkg, dep)
			}
		}
	}
}
