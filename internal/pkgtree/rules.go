package pkgtree

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
)

// The per-entry rules of [PKG-2] and [PKG-3], in one place for every reader
// of a package: Scan applies them to what it reads from the file system, and
// the transfer receiver applies them to the names, types and modes an
// envelope declares before it writes anything, then scans what it rebuilt.
// A tree that bind refuses is therefore refused by a receiver too, with the
// same code ([XFER-2], [XFER-3]).
//
// In each, what names the package (for example "package /src/pkg") and rel
// the entry's path relative to its root; both only shape the message.

// maxName is the longest name a Linux file system stores (NAME_MAX).
const maxName = 255

// GitName is the entry that makes a directory a Git work tree (a directory)
// or a linked work tree or task copy (a file). [PKG-2] refuses it in the
// package root and every ancestor (CheckLocation); CheckName refuses it at
// any depth inside the tree, so a store copy never holds a work tree whose
// configuration (core.fsmonitor, hooks) a git run there would obey.
const GitName = ".git"

// CheckName refuses, as path-unsafe, a name that cannot be one path
// component of a package entry: empty, "." or "..", holding a '/', longer
// than 255 bytes, invalid UTF-8 or holding a control character (C0, DEL,
// C1) ([PKG-3]), or ".git" ([PKG-2]). A directory read never returns the
// first four; an envelope can declare them.
func CheckName(what, rel, name string) error {
	why := ""
	switch {
	case name == "" || name == "." || name == "..":
		why = "is not a name"
	case strings.Contains(name, "/"):
		why = "holds a '/'"
	case len(name) > maxName:
		why = "is longer than 255 bytes"
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		why = "has a control character or invalid utf-8"
	case name == GitName:
		why = "is a git work tree entry; a package never holds one (copy it without .git)"
	default:
		return nil
	}
	return errcode.New(errcode.PathUnsafe, "%s: name %q %s", what, rel, why)
}

// CheckType refuses an entry type (unix.S_IFMT bits of a mode; 0 for a type
// that has none) other than a directory or a regular file: a symlink is
// link-unsafe, anything else package-invalid ([PKG-3]).
func CheckType(what, rel string, typ uint32) error {
	switch typ {
	case unix.S_IFDIR, unix.S_IFREG:
		return nil
	case unix.S_IFLNK:
		return errcode.New(errcode.LinkUnsafe, "%s: symlink at %q", what, rel)
	}
	return errcode.New(errcode.PackageInvalid, "%s: %q is not a directory or regular file", what, rel)
}

// CheckPerm refuses, as mode-unsafe, permission bits that let the group or
// others write ([PKG-3]): another user could change trusted code after it
// was validated.
func CheckPerm(what, rel string, perm uint32) error {
	if perm&0o022 != 0 {
		return errcode.New(errcode.ModeUnsafe, "%s: %q is group- or world-writable (mode %04o); chmod go-w it", what, rel, perm)
	}
	return nil
}
