package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// maxFuncLines is the longest a function of this package may be, counted
// from the line of its func keyword to the line of its closing brace.
const maxFuncLines = 80

// Issue 11: the CLI is a table of named verbs (verbs.go), not long
// registration closures. No function or function literal in internal/cli,
// its tests included, is longer than maxFuncLines: a verb that grows past it
// moves its logic into the package that owns the behaviour.
func TestNoLongFunctions(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files here: %v", err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var what string
			switch fn := n.(type) {
			case *ast.FuncDecl:
				what = fn.Name.Name
			case *ast.FuncLit:
				what = "a function literal"
			default:
				return true
			}
			seen++
			start, end := fset.Position(n.Pos()), fset.Position(n.End())
			if lines := end.Line - start.Line + 1; lines > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long; at most %d", name, start.Line, what, lines, maxFuncLines)
			}
			return true
		})
	}
	if seen < 50 {
		t.Fatalf("only %d functions found: is the test in internal/cli?", seen)
	}
}
