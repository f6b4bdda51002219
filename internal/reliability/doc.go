// Package reliability holds the evidence that fm never loses anything:
// crash injection (SIGKILL of every mutating command at random
// points, then the contract's invariants), the serve soak, and the corpus of
// hostile packages. Its tests run the real fm binary against throwaway
// homes, with internal/testpkg's fake package in every part; its only code
// is StrictJSON, an independent reference of the strict JSON rules for the
// differential fuzz tests of the host's readers. docs/reliability.md lists the figures and how to reproduce
// them; bench/crash.sh and bench/soak.sh run the long versions.
package reliability
