package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// No exported signature of a public package (pkg/...) names a type of a
// third-party module or of fm's internal packages: an adapter author's code
// depends on this module's public API and the standard library only, so a
// change of go-json-experiment, say, can never break it.
func TestPublicSignaturesUseNoForeignTypes(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		foreign := map[string]string{} // import name -> path
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			if !strings.Contains(first, ".") || strings.HasPrefix(p, "firstmate.dev/fm/pkg/") {
				continue // the standard library, or a public package of fm
			}
			name := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			foreign[name] = p
		}
		check := func(what string, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && foreign[x.Name] != "" {
						t.Errorf("%s: %s names %s.%s (%s)", fset.Position(sel.Pos()), what, x.Name, sel.Sel.Name, foreign[x.Name])
					}
				}
				return true
			})
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || (d.Recv != nil && !exportedRecv(d.Recv)) {
					continue
				}
				check(d.Name.Name, d.Type)
				if d.Recv != nil {
					check(d.Name.Name, d.Recv)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							checkType(s, check)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								check(n.Name, s.Type)
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("read only %d files of pkg/; is the walk broken?", files)
	}
}

// checkType checks what of a type declaration is exported: an alias or a
// defined type's underlying type, but of a struct only its exported fields
// and of an interface only its exported methods.
func checkType(s *ast.TypeSpec, check func(string, ast.Node)) {
	var fields *ast.FieldList
	switch ty := s.Type.(type) {
	case *ast.StructType:
		fields = ty.Fields
	case *ast.InterfaceType:
		fields = ty.Methods
	default:
		check(s.Name.Name, s.Type)
		return
	}
	for _, f := range fields.List {
		if len(f.Names) == 0 {
			check(s.Name.Name, f.Type) // embedded
		}
		for _, n := range f.Names {
			if n.IsExported() {
				check(s.Name.Name+"."+n.Name, f.Type)
			}
		}
	}
}

func exportedRecv(recv *ast.FieldList) bool {
	ty := recv.List[0].Type
	if star, ok := ty.(*ast.StarExpr); ok {
		ty = star.X
	}
	if idx, ok := ty.(*ast.IndexExpr); ok {
		ty = idx.X
	}
	id, ok := ty.(*ast.Ident)
	return ok && id.IsExported()
}
