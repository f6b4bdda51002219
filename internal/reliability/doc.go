// Package reliability holds the evidence that fm never loses anything
// (issue 7): crash injection (SIGKILL of every mutating command at random
// points, then the contract's invariants), the serve soak, and the corpus of
// hostile packages. It has no code of its own: the tests run the real fm
// binary against throwaway homes, with internal/testpkg's fake package in
// every part. docs/reliability.md lists the figures and how to reproduce
// them; bench/crash.sh and bench/soak.sh run the long versions.
package reliability
