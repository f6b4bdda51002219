package wake

// StateDir is stateDir for the external tests (package wake_test).
var StateDir = stateDir
