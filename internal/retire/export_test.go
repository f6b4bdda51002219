package retire

import (
	"testing"

	"firstmate.dev/fm/internal/binding"
)

// SetBeforeMove runs f at the start of every binding-move step until t ends.
func SetBeforeMove(t testing.TB, f func(b *binding.Binding)) {
	beforeMove = f
	t.Cleanup(func() { beforeMove = nil })
}
