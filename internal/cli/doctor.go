package cli

import (
	"fmt"
	"text/tabwriter"

	"firstmate.dev/fm/internal/doctor"
)

// `fm doctor` prints the findings of the checks in internal/doctor, one line
// each (ok, warn, FAIL with the fix), then a summary. It exits 0 when no
// check failed (warnings allowed) and 1 when one did. It is a report, not an
// operation: even when it exits 1 its whole report is on stdout and there is
// no error line; only a usage error follows [CLI-3].

// doctorReport is `fm doctor`.
func doctorReport(e *Env, f *jsonFlag, args []string) error {
	if err := need(args, 0, 0, "no arguments"); err != nil {
		return err
	}
	dir := ""
	var findings []doctor.Finding
	if h, err := e.Home(); err != nil {
		findings = doctor.Unresolved(err)
	} else {
		dir, findings = h.Dir, doctor.Check(h)
	}
	// A failure's message is an error's text: one line, like every error
	// fm prints.
	for i := range findings {
		if findings[i].Status == doctor.Fail {
			findings[i].Message = oneLine(findings[i].Message)
		}
	}
	if err := printFindings(e, dir, findings, f.json); err != nil {
		return err
	}
	if problems, _ := doctor.Count(findings); problems > 0 {
		return &ExitError{Status: 1}
	}
	return nil
}

// printFindings writes the report of the home dir ("" when it did not
// resolve): aligned lines and a summary, or one JSON document.
func printFindings(e *Env, dir string, findings []doctor.Finding, asJSON bool) error {
	problems, warnings := doctor.Count(findings)
	if asJSON {
		return writeJSON(e, map[string]any{"home": dir, "healthy": problems == 0, "problems": problems, "warnings": warnings, "findings": findings})
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	for _, f := range findings {
		msg := f.Message
		if f.Code != "" {
			msg = "[" + string(f.Code) + "] " + msg
		}
		if f.Fix != "" {
			msg += "; fix: " + f.Fix
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Status, f.Check, msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if problems == 0 {
		fmt.Fprintf(e.Stdout, "healthy: %d warning(s)\n", warnings)
	} else {
		fmt.Fprintf(e.Stdout, "unhealthy: %d problem(s), %d warning(s)\n", problems, warnings)
	}
	return nil
}
