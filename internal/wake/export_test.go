package wake

// StateDir is stateDir for the external tests (package wake_test).
var StateDir = stateDir

// MarkTemp is markTemp for the external tests: where the mark's previous
// file is kept for the next write to reuse.
const MarkTemp = markTemp
