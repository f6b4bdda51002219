package launch

import (
	"path/filepath"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
)

// # Spare record files
//
// Every invocation writes its record twice (reserved, then phase group)
// and removes it once: two inodes allocated and two freed per invocation
// with new files, hundreds a second in a serve, which on ext4 without a
// journal made each create search past the inodes freed in the last ~30 s
// (fsutil's "Spare files" has the whole story). With spares kept in a
// records directory (KeepSpares), the reserved record's file, swapped out
// by the rewrite in phase group (fsutil.Pending.ExchangeKeeping), and a finished
// invocation's record (release) are kept as spares under temporary names
// of this process, in the directory's own form (tempName), and the next
// record write reuses one (newFile): listings ignore them, and Cleanup
// removes them once this process is dead.
//
// One thing changes for readers: a file that a reader opened as record R
// may, once R is removed, be rewritten with another record while the
// reader still holds it. So a reader checks, after reading, that R still
// names the file it read (recordDir.readOnce); a file that left R is never
// at R again, because record names are never reused (random) and each
// rewrite of R swaps in a file that was not at R.
//
// Only a long-running host keeps spares (serve, for its home's
// directory): a one-shot command's would outlive it as temporary files
// until the next Cleanup.

// KeepSpares makes this process keep spare record files in the records
// directory records (see "Spare record files" and fsutil's "Spare files")
// until the returned function is called; when the last such caller for
// that directory is done, its spares are unlinked. A host calls it for its
// lifetime, and calls the function before it exits.
func KeepSpares(records string) (done func()) {
	return fsutil.KeepSpares(records, spareName)
}

// newFile starts the file a record is written to before it is published
// as name: a spare when the directory has one fit to reuse, else a new
// file at the temporary name of name.
func (d *recordDir) newFile(name string, host Identity) (*fsutil.Pending, error) {
	return fsutil.NewSpareAt(d.dir, fsutil.NewOptions{Temp: tempName(name, host), NoSync: true})
}

// release removes this process's record name at the end of its
// invocation: kept as a spare under a fresh temporary name when the
// directory's pool has room, else unlinked (fsutil.RetireAt). It reports
// false if name was already gone. Like write, it does not fsync (see
// "Records and durability").
func (d *recordDir) release(name string) (bool, error) {
	removed, err := fsutil.RetireAt(d.dir, name)
	if err != nil {
		return false, errcode.Wrap(errcode.Internal, err, "remove invocation record %s", filepath.Join(d.path, name))
	}
	return removed, nil
}

// spareName is a fresh temporary name of this process, for a record file
// that is released into the pool: a temporary file in the records
// directory's own form (tempName), which its listings ignore and Cleanup
// removes once this process is dead.
func spareName() (string, error) {
	host, err := selfIdentity()
	if err != nil {
		return "", err
	}
	fresh, err := newRecordName("")
	if err != nil {
		return "", err
	}
	return tempName(fresh, host), nil
}
