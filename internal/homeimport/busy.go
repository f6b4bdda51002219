package homeimport

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	json "github.com/go-json-experiment/json"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/fsutil"
	"firstmate.dev/fm/internal/home"
	"firstmate.dev/fm/internal/launch"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/shown"
)

// Whether the earlier implementation may still run in a home ([LIFE-1]).
//
// Its processes leave these traces, each checked here, read-only, before the
// import changes anything, and again under fm's locks right before it does:
//
//   - state/procevent/<id>.runner holds the pid of a source's runner;
//   - its claims, outside the home in the claim root (FM_PROCEVENT_CLAIM_ROOT,
//     else ${XDG_STATE_HOME:-$HOME/.local/state}/firstmate/procevent-claims):
//     <id>.claim, whose line 1 names the owning home, line 2 the runner pid,
//     line 7 "active" or "terminal" and line 8 the state root;
//   - its locks, the lifecycle lock state/procevent/.extension-binding-
//     lifecycle.lock and a source's <claim root>/<id>.lock: symlinks to an
//     owner directory holding the holder's pid;
//   - its invocation records in state/extension-invocations, whose process
//     groups fm cannot prove gone.
//
// A pid is alive when /proc shows a process with it that is not a zombie. A
// pid can be reused, so a live pid may be a stranger: the import then refuses
// although nothing of the earlier implementation runs, which is the safe
// side; the message names the pid and the file, and the operator who knows
// better removes the file. fm's own runners are checked too: its serve lock
// and the claims of its sources (procevent.Held).

// lifecycleLockName is the earlier implementation's lifecycle lock.
const lifecycleLockName = ".extension-binding-lifecycle.lock"

// claimRoot is the earlier implementation's claim root, or "" when neither
// FM_PROCEVENT_CLAIM_ROOT, XDG_STATE_HOME nor HOME is set.
func claimRoot() string {
	if r := os.Getenv("FM_PROCEVENT_CLAIM_ROOT"); r != "" {
		return r
	}
	state := os.Getenv("XDG_STATE_HOME")
	if state == "" {
		h := os.Getenv("HOME")
		if h == "" {
			return ""
		}
		state = filepath.Join(h, ".local", "state")
	}
	return filepath.Join(state, "firstmate", "procevent-claims")
}

// readSmall reads at most 64 KiB of a regular file without following a
// link (and without blocking on a FIFO).
func readSmall(path string) ([]byte, error) {
	f, err := fsutil.OpenNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errcode.New(errcode.PathUnsafe, "%q is not a regular file; move it aside", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSmall+1))
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %q", path)
	}
	if len(data) > maxSmall {
		return nil, errcode.New(errcode.JSONOversized, "%q is larger than %d bytes, more than the earlier implementation ever wrote there; move it aside", path, maxSmall)
	}
	return data, nil
}

// maxSmall bounds every record the import reads (registrations, sidecars,
// counters, receipts, pid files, claims).
const maxSmall = 1 << 20

// pidIn reads a file holding a decimal pid and a newline (or not).
func pidIn(path string) (int, bool) {
	data, err := readSmall(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSuffix(string(data), "\n")
	pid, err := strconv.Atoi(s)
	return pid, err == nil && pid > 0 && strconv.Itoa(pid) == s
}

// alive is launch.PIDAlive, an error reading /proc counting as alive (the
// conservative answer).
func alive(pid int) bool {
	ok, err := launch.PIDAlive(pid)
	return ok || err != nil
}

// lockHolder describes the holder of the symlink lock at path when it may
// be alive, or returns "": no lock, a link to nothing (its holder removed its
// owner directory, or never made one), or a holder pid that is dead. An owner
// directory without a readable pid may be a lock being taken right now, so
// it counts as held.
func lockHolder(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	if !exists(target) {
		return ""
	}
	pid, ok := pidIn(filepath.Join(target, "pid"))
	switch {
	case !ok:
		return "a holder whose pid cannot be read from " + shown.Path(filepath.Join(target, "pid"))
	case alive(pid):
		return "pid " + strconv.Itoa(pid)
	}
	return ""
}

// busy lists, one line each with its resolution, every trace of a process
// of the earlier implementation (or of fm) that may still run in h.
func busy(h *home.Home) ([]string, error) {
	var out []string
	reg := h.Registrations()
	ids := map[string]bool{}
	names, err := readNames(reg)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if id, ok := strings.CutSuffix(n, ".runner"); ok {
			ids[id] = true
			switch pid, ok := pidIn(filepath.Join(reg, n)); {
			case !ok:
				out = append(out, fmt.Sprintf("the runner file %s does not hold a pid: make sure no runner of source %q runs, then remove it", shown.Path(filepath.Join(reg, n)), id))
			case alive(pid):
				out = append(out, fmt.Sprintf("the runner of source %q (pid %d, %s) is alive: stop the earlier implementation's runner (kill %d) and wait until it exits", id, pid, shown.Path(filepath.Join(reg, n)), pid))
			}
		} else if id, ok := strings.CutSuffix(n, ".source"); ok {
			ids[id] = true
		}
	}
	if who := lockHolder(filepath.Join(reg, lifecycleLockName)); who != "" {
		out = append(out, fmt.Sprintf("the lifecycle lock %s is held by %s: let that command of the earlier implementation finish (or stop it)", filepath.Join(reg, lifecycleLockName), who))
	}
	if root := claimRoot(); root != "" {
		claims, err := readNames(root)
		if err != nil {
			return nil, err
		}
		for _, n := range claims {
			id, ok := strings.CutSuffix(n, ".claim")
			if !ok {
				continue
			}
			path := filepath.Join(root, n)
			var l []string
			data, err := readSmall(path)
			if err == nil {
				l = strings.Split(string(data), "\n")
			}
			if len(l) < 8 {
				// Unreadable or cut short: it cannot be told whose it is,
				// nor whether its runner lives. A claim of one of this
				// home's sources may be a live runner's, so it refuses.
				if ids[id] || len(l) > 0 && samePath(l[0], h.Dir) {
					out = append(out, fmt.Sprintf("the claim %s of source %q cannot be read as a claim (a regular file of 12 lines): make sure no runner of that source runs, then remove it", shown.Path(path), id))
				}
				continue
			}
			if !samePath(l[0], h.Dir) && !samePath(l[7], h.State) {
				continue // another home's
			}
			ids[id] = true
			if l[6] == "terminal" {
				continue
			}
			switch pid, err := strconv.Atoi(l[1]); {
			case err != nil || pid <= 0:
				out = append(out, fmt.Sprintf("the claim %s of source %q is %q but holds no runner pid: make sure no runner of that source runs, then remove it", shown.Path(path), id, l[6]))
			case alive(pid):
				out = append(out, fmt.Sprintf("the claim %s of source %q is %q and its runner pid %d is alive: stop that runner and wait until it exits", shown.Path(path), id, l[6], pid))
			}
		}
		for id := range ids {
			p := filepath.Join(root, id+".lock")
			if who := lockHolder(p); who != "" {
				out = append(out, fmt.Sprintf("the source lock %s is held by %s: let that runner of the earlier implementation finish (or stop it)", shown.Path(p), who))
			}
		}
	}
	inv := h.Invocations()
	recs, err := readNames(inv)
	if err != nil {
		return nil, err
	}
	var foreign []string
	for _, n := range recs {
		if !fmRecord(filepath.Join(inv, n), n) {
			foreign = append(foreign, n)
		}
	}
	if len(foreign) > 0 {
		out = append(out, fmt.Sprintf("%s holds invocation records of the earlier implementation (%s): stop its host (fm-extension.mjs) and let it finish; if none runs, make sure no process of the group they name remains, then move them out of that directory", inv, shown.Path(strings.Join(foreign, ", "))))
	}
	held, err := procevent.Held(h)
	if err != nil {
		return nil, err
	}
	for _, p := range held {
		out = append(out, fmt.Sprintf("an fm process holds %s: stop fm procevent serve (or wait for the running poll to end)", p))
	}
	return out, nil
}

// fmRecord reports whether the entry n of the invocation records directory
// is fm's: one of its names, and for an owner record fm's schema.
func fmRecord(path, n string) bool {
	if !launch.IsRecordName(n) {
		return false
	}
	if !strings.HasSuffix(n, ".owner.json") {
		return true
	}
	data, err := readSmall(path)
	if err != nil {
		return false
	}
	var r struct {
		Schema string `json:"schema"`
	}
	return json.Unmarshal(data, &r, json.RejectUnknownMembers(false)) == nil && r.Schema == launch.RecordSchema
}

// readNames lists a directory; an absent one is empty.
func readNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, errcode.New(errcode.PathUnsafe, "%s is not a directory; move it aside, then run fm home import again", dir)
	}
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "read %s", dir)
	}
	out := make([]string, len(ents))
	for i, e := range ents {
		out[i] = e.Name()
	}
	return out, nil
}

// idle refuses with home-busy, listing busy's findings, while anything may
// still run in h.
func idle(h *home.Home) error {
	found, err := busy(h)
	if err != nil || len(found) == 0 {
		return err
	}
	return errcode.New(errcode.HomeBusy, "something may still run in this home; nothing was changed: %s", strings.Join(found, "; "))
}

// samePath reports whether the recorded path p names dir (canonical), also
// when it was recorded through a symlink.
func samePath(p, dir string) bool {
	if p == dir {
		return true
	}
	c, err := filepath.EvalSymlinks(p)
	return err == nil && c == dir
}
