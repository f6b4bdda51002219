package confine

import (
	"errors"
	"os"
	"path/filepath"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// Mode is a home's confinement setting [CONF-2].
type Mode string

// The modes. Enforce applies what the kernel can enforce and says what it
// could not; Strict refuses to run a package the kernel cannot confine
// fully (confinement-unavailable); Off runs packages with the user's full
// rights, as the earlier implementation did.
const (
	Enforce Mode = "enforce"
	Strict  Mode = "strict"
	Off     Mode = "off"
)

// ParseMode accepts exactly one of the three mode names.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Enforce, Strict, Off:
		return m, nil
	}
	return "", errcode.New(errcode.Usage, "confinement mode %q: want enforce, strict or off", s)
}

// FileName is the home setting's file in the home's config directory. It
// holds one mode name and a newline, nothing else; an absent file is
// Enforce. It is fm's own file: binding records and transfer envelopes do
// not carry confinement.
const FileName = "confinement"

// maxFile bounds the setting file.
const maxFile = 64

// ReadMode reads the setting of the home whose config directory is config:
// the mode, and whether the file sets it (false: the default, Enforce). A
// file that is not exactly a mode name and a newline is schema-invalid.
func ReadMode(config string) (Mode, bool, error) {
	path := filepath.Join(config, FileName)
	b, err := fsutil.ReadPrivateFile(path, maxFile)
	if errors.Is(err, os.ErrNotExist) {
		return Enforce, false, nil
	}
	if err != nil {
		return "", false, err
	}
	n := len(b)
	if n == 0 || b[n-1] != '\n' {
		return "", false, errcode.New(errcode.SchemaInvalid, "%q must hold one of enforce, strict, off and a newline", path)
	}
	m, err := ParseMode(string(b[:n-1]))
	if err != nil {
		return "", false, errcode.New(errcode.SchemaInvalid, "%q must hold one of enforce, strict, off and a newline", path)
	}
	return m, true, nil
}

// WriteMode durably sets the mode of the home whose config directory is
// config, creating the directory (0700) if absent.
func WriteMode(config string, m Mode) error {
	if _, err := ParseMode(string(m)); err != nil {
		return err
	}
	if err := fsutil.MkdirAllSync(config, 0o700); err != nil {
		return errcode.Wrap(errcode.Internal, err, "create %q", config)
	}
	dir, err := fsutil.OpenDir(config, fsutil.DirRule{What: "config directory", Perm: fsutil.NoGroupWrite})
	if err != nil {
		return err
	}
	defer dir.Close()
	return fsutil.ReplaceAt(dir, FileName, []byte(string(m)+"\n"))
}
