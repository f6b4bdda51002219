// Package procevent is the process-event core (CONTRACT §10, §11 announcement,
// §13 [LIFE-2] preflight and [LIFE-3]): source registrations, claims, the
// generic runner, durable capture, announcement, handling, verdicts,
// classification, supervision (serve, reconcile), retirement and the home
// sweep.
//
// Layout in the state root ([HOME-4]), every directory 0700, every file 0600:
//
//	procevent/<source-id>.source      registration record (one generation)
//	procevent/<source-id>.claim       claim lock of the source's runner (exists
//	                                  only while the source is registered)
//	procevent/<source-id>.stop        stop-request lock of a waiting retire
//	procevent/<source-id>.seq         durable sequence counter of the source
//	procevent/serve.lock              one-serve-per-home lock
//	procevent/serve.pid               that serve's pid, shown only (servelife.go)
//	procevent-status/<id>.json        fm's state and history of the source
//	                                  (health.go, [STAT-1]); .debug, .stderr,
//	                                  .stderr.1: the operator's opt-in debug
//	                                  log (debug.go, [STAT-6])
//	procevent-inbox/<id>.<seq>.meta.json, .pending, .result, .handled
//	                                  see inbox.go and announce.go
//	extension-invocations/            owner records of every supervised process,
//	                                  built-in ones included (builtin.go)
//	.wake-queue                       see package wake
//
// Rules, and where each is enforced:
//
//   - Every operation works through pinned directory handles (dirs.go): the
//     directories are checked once on the opened descriptors, every access
//     goes through openat/linkat/renameat relative to them, and the paths
//     are checked to still name them right before each capture or
//     registration. A substitution refuses or lands in the pinned directory;
//     it never redirects a write. External polls hold the stricter boundary
//     of [CAP-6] (exactly 0700); built-ins the private rule of [HOME-3].
//   - At most one poll per source at a time, by a kernel lock that dies with
//     its holder and is never stolen (claim.go, [RUN-4]), and by the owner
//     records of polls, built-in and extension alike, whose groups must be
//     proved gone before the source polls again, is re-registered or retired
//     (builtin.go, runner.go, retire.go, [GRP-3], [REG-4]).
//   - Capture is durable before it is announced, captured sequence numbers
//     never repeat, and a capture that failed before its result was published
//     consumed nothing (inbox.go, runner.go, [CAP-1], [RID-1]).
//   - A result is never re-announced while its runner still decides its
//     announcement (announce.go, [CAP-4]).
//   - A captured result is only ever interpreted by its captured owner, and
//     the state-changing verdicts only by the runner that captured it, through
//     an in-process capability (verdict.go, [CAP-4], [CAP-7]).
//   - A source failing again and again is one item: a repeated failure with
//     the same code is counted in its status file while its evidence is
//     unhandled, never captured again (health.go, [OP-5]).
//   - Retirement acts on exact identities: the owner token of a generation,
//     the complete built-in record, or absence (retire.go, [REG-4]).
//
// What is not promised: exactly-once delivery or source-side losslessness. A
// result an adapter returned to a runner that died before publishing it is
// lost to Firstmate (the next poll repeats the request id, so an adapter that
// keys its replay on the id can return it again). See docs/procevent.md.
package procevent
