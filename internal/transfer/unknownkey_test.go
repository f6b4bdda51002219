package transfer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"firstmate.dev/fm/internal/errcode"
)

// [JSON-1] [XFER-6]: an unknown key in a receipt is refused with a message
// that names it (docs/configuration.md: "the message names the file, field
// or value at fault").
func TestReceiptUnknownKeyNamed(t *testing.T) {
	h, r := receive(t)
	p := filepath.Join(r.Unit, ReceiptFile)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, p, bytes.Replace(data, []byte("{\n"), []byte("{\n  \"zz_extra\": 1,\n"), 1), 0o600)
	_, err = Retire(context.Background(), h, exampleID, r.TransferDigest, r.Binding.Digest)
	wantCode(t, err, errcode.SchemaInvalid)
	if !strings.Contains(err.Error(), `unknown key at "/zz_extra"`) || !strings.Contains(err.Error(), p) {
		t.Fatalf("message %q does not name the key and the file", err)
	}
}
