package launch

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procstat"
)

// Cleanup resolves the owner records in records that match selects, and
// removes each one whose group it proves gone [GRP-3]. It returns how many it
// removed, and process-cleanup-failed if any selected record stays. An absent
// directory has nothing to clean; a record of this boot that cannot be read
// fails the call (json-invalid, schema-invalid, ...) before anything is
// signalled.
//
// match sees each record with HostLive set. A record whose host is alive is a
// live invocation: Cleanup never touches it, whatever match says; if match
// selects it, it counts as unresolved (the caller asked for it to be gone and
// it is not). Callers that mean "only what dead hosts left" return false for
// r.HostLive.
//
// Decision table for a selected record whose host (pid + start time + boot
// id) is not alive:
//
//	phase reserved                         -> cleared. The release byte is written
//	                                          only after the record is rewritten in
//	                                          phase group, so no package code ran;
//	                                          a barrier that may still be alive for
//	                                          an instant holds the only read end of a
//	                                          pipe whose writer died, and can only
//	                                          read end of file and exit 125.
//	phase group, other boot id             -> cleared: nothing of that boot runs.
//	leader pid runs with the recorded      -> proved ours: the exact group (through
//	start time (alive or zombie), in the      a pidfd of the leader, re-checked after
//	recorded session, not leading it          opening) gets TERM, then KILL after
//	                                          500 ms; cleared once proved gone, kept
//	                                          if not within 5 s.
//	leader pid runs with the recorded      -> kept, nothing signalled: fm makes
//	start time but leads a session, is        every group inside its own session
//	in another session, or the record         and never a session leader, so this
//	names no session, or it is the            is not a group fm made [GRP-3].
//	caller's own process group
//	leader pid runs with another start     -> kept, nothing signalled (pid reused:
//	time                                      uncertain).
//	leader pid gone, kill(-pgid, 0) fails  -> cleared: no process has that pgid.
//	with ESRCH
//	leader pid gone, every process with    -> cleared [GRP-4]: nothing of any group
//	that pgid is a zombie                     with that number is alive.
//	leader pid gone, a live process has    -> kept, nothing signalled. Once the
//	that pgid                                 leader is reaped its number can be
//	                                          reused for a new group whose members
//	                                          also started after the leader, so no
//	                                          start time proves such a member ours.
//
// "Proved gone" means the kernel reports no process in the group, or every
// process left in it is a zombie [GRP-4]. Cleanup reaps nothing: the members
// of a dead host's group are not its children.
//
// Temporary files of dead writers are removed as well; they carry no
// ownership. So are records that cannot be read and whose name says they were
// written in an earlier boot (see List): whatever is selected, they own
// nothing and are not counted.
func Cleanup(records string, match func(Record) bool) (cleaned int, err error) {
	cleaned, _, err = cleanup(records, everyRecord, match)
	return cleaned, err
}

// CleanupSource is Cleanup of the records of invocations for source id that
// match: it reads only the records and temporary files whose names carry
// id's key, and those named before the index (see sourceKey). It also
// returns, from the same listing, the records of source id that it left
// (HostLive set; on an error, none): ListSource after it, for a caller that
// holds the source's claim, under which no invocation of the source starts,
// without listing the directory again.
func CleanupSource(records, id string, match func(Record) bool) (cleaned int, left []Record, err error) {
	cleaned, left, err = cleanup(records, sourceScope(id), func(r Record) bool { return r.SourceID == id && match(r) })
	if err != nil {
		return cleaned, nil, err
	}
	var out []Record
	for _, r := range left {
		if r.SourceID == id {
			out = append(out, r)
		}
	}
	return cleaned, out, nil
}

// cleanup is Cleanup of the records in sc; it returns the records in sc
// that it did not remove. The directory is scanned once: the debris of
// that scan is removed too (a temporary file written since is a live
// writer's; a record read since an earlier boot's is not new).
func cleanup(records string, sc scope, match func(Record) bool) (cleaned int, left []Record, err error) {
	d, err := openRecordDir(records, false)
	if d == nil || err != nil {
		return 0, nil, err
	}
	defer d.close()
	recs, seen, err := d.listScan(sc)
	if err != nil {
		return 0, nil, err
	}
	var selected []Record
	for _, r := range recs {
		if match(r) {
			selected = append(selected, r)
		}
	}
	// Groups are stopped concurrently: each may take a TERM grace.
	reasons := make([]string, len(selected))
	errs := make([]error, len(selected))
	var wg sync.WaitGroup
	for i, r := range selected {
		wg.Go(func() {
			if r.HostLive {
				reasons[i] = "its host is alive (live invocation)"
				return
			}
			reasons[i], errs[i] = resolve(r)
		})
	}
	wg.Wait()
	var kept []string
	gone := map[string]bool{}
	for i, r := range selected {
		if errs[i] != nil {
			return cleaned, nil, errs[i]
		}
		if reasons[i] != "" {
			kept = append(kept, fmt.Sprintf("%s: %s", filepath.Base(r.Path), reasons[i]))
			continue
		}
		removed, err := d.remove(filepath.Base(r.Path))
		if err != nil {
			return cleaned, nil, err
		}
		gone[r.Path] = true
		if removed {
			cleaned++
		}
	}
	if err := d.removeDebris(seen); err != nil {
		return cleaned, nil, err
	}
	if len(kept) > 0 {
		return cleaned, nil, errcode.New(errcode.ProcessCleanupFailed,
			"%d invocation record(s) in %s stay unresolved: %s", len(kept), records, strings.Join(kept, "; "))
	}
	for _, r := range recs {
		if !gone[r.Path] {
			left = append(left, r)
		}
	}
	return cleaned, left, nil
}

// resolve applies the decision table to a record whose host is dead. It
// returns "" when the record's group is proved gone, else why it stays.
func resolve(r Record) (reason string, err error) {
	if r.Phase == PhaseReserved {
		return "", nil
	}
	boot, err := BootID()
	if err != nil {
		return "", err
	}
	leader := *r.Leader
	if leader.BootID != boot {
		return "", nil
	}
	st, err := procstat.Read(leader.PID)
	if errors.Is(err, procstat.ErrNoProcess) {
		return resolveWithoutLeader(leader.PID)
	}
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "read process %d", leader.PID)
	}
	if st.Start != leader.StartTime {
		return fmt.Sprintf("leader pid %d now belongs to another process (start time %d, recorded %d); nothing signalled", leader.PID, st.Start, leader.StartTime), nil
	}
	pidfd, err := unix.PidfdOpen(leader.PID, 0)
	if err == unix.ESRCH {
		return resolveWithoutLeader(leader.PID)
	}
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "pidfd for process %d", leader.PID)
	}
	defer unix.Close(pidfd)
	// The pidfd names whatever had the pid when it was opened; the start
	// time read after opening proves that this is still the leader.
	st, err = procstat.Read(leader.PID)
	if errors.Is(err, procstat.ErrNoProcess) {
		return resolveWithoutLeader(leader.PID)
	}
	if err != nil {
		return "", errcode.Wrap(errcode.Internal, err, "read process %d", leader.PID)
	}
	if st.Start != leader.StartTime {
		return fmt.Sprintf("leader pid %d was reused while it was checked; nothing signalled", leader.PID), nil
	}
	// fm makes every group with setpgid inside its own session, so a leader
	// that leads a session, or sits in another session than the recorded
	// one, is not a group fm made, whatever the record says.
	switch {
	case r.SessionID == nil:
		return fmt.Sprintf("record names no session for leader %d; it cannot be proved fm's group, so nothing was signalled", leader.PID), nil
	case st.SID == leader.PID:
		return fmt.Sprintf("leader %d leads its own session; fm never makes one, so nothing was signalled", leader.PID), nil
	case st.SID != *r.SessionID:
		return fmt.Sprintf("leader %d is in session %d, not the recorded %d; nothing signalled", leader.PID, st.SID, *r.SessionID), nil
	case leader.PID == unix.Getpgrp():
		// fm's groups are new ones, never the group of an fm process:
		// stopping it would stop this cleanup and whatever ran it.
		return fmt.Sprintf("process group %d is this cleanup's own; fm never records it, so nothing was signalled", leader.PID), nil
	}
	g := group{pgid: leader.PID, pidfd: pidfd}
	ok, err := g.stopForeign()
	if err != nil {
		return "", err
	}
	if !ok {
		return fmt.Sprintf("process group %d is still alive after TERM and KILL", g.pgid), nil
	}
	return "", nil
}

// resolveWithoutLeader decides a group whose leader no longer exists. Only
// the kernel's "no such process group" or an all-zombie group clears it;
// nothing is signalled.
func resolveWithoutLeader(pgid int) (string, error) {
	if unix.Kill(-pgid, 0) == unix.ESRCH {
		return "", nil
	}
	ms, err := members(pgid)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if !m.Dead() {
			return fmt.Sprintf("leader %d is gone but process %d still has process group %d; it cannot be proved to be the recorded group, so nothing was signalled", pgid, m.pid, pgid), nil
		}
	}
	return "", nil
}

// removeDebris removes the temporary files of the scan whose writer is no longer
// alive, and its unreadable records of earlier boots. A temporary name holds the
// writer's pid and start time, checked against this boot, so a writer pid and
// start time of an earlier boot that match a live process of this one keep
// the file: safe, only untidy.
func (d *recordDir) removeDebris(seen scanned) error {
	boot, err := BootID()
	if err != nil {
		return err
	}
	for _, name := range seen.records {
		if nameBoot(recordHex(name)) == bootPrefix(boot) {
			continue
		}
		if _, err := d.read(name); err == nil || errors.Is(err, unix.ENOENT) {
			continue // readable: the decision table applies
		}
		if _, err := d.remove(name); err != nil {
			return err
		}
	}
	for _, name := range seen.temps {
		writer, _, _ := parseTempName(name)
		writer.BootID = boot
		live, err := alive(writer)
		if err != nil {
			return err
		}
		if live {
			continue
		}
		if _, err := d.remove(name); err != nil {
			return err
		}
	}
	return nil
}
