package testpkg

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// ReturnsAny lists the exported functions and methods of the Go package in
// dir (its non-test files) that have a result of type any: the identifier
// any, an empty interface{}, or a type of the package declared as an alias
// of either. Each entry is "file:line: Name". A result of type any makes
// every caller assert the type of the answer, unchecked by the compiler.
func ReturnsAny(dir string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no Go files in %s", dir)
	}
	untyped := func(e ast.Expr) bool {
		switch t := e.(type) {
		case *ast.Ident:
			return t.Name == "any"
		case *ast.InterfaceType:
			return len(t.Methods.List) == 0
		}
		return false
	}
	aliases := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					if ts := s.(*ast.TypeSpec); ts.Assign.IsValid() && untyped(ts.Type) {
						aliases[ts.Name.Name] = true
					}
				}
			}
		}
	}
	var out []string
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !fn.Name.IsExported() || fn.Type.Results == nil {
				continue
			}
			for _, r := range fn.Type.Results.List {
				id, named := r.Type.(*ast.Ident)
				if untyped(r.Type) || (named && aliases[id.Name]) {
					p := fset.Position(fn.Pos())
					out = append(out, fmt.Sprintf("%s:%d: %s", filepath.Base(p.Filename), p.Line, fn.Name.Name))
					break
				}
			}
		}
	}
	return out, nil
}
