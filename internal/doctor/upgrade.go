package doctor

import (
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/upgrade"
)

// checkUpgrades fails, only when there is one, every upgrade that stopped
// between its first and last change ([UPG-4]): its plan names the sources
// it moves, and the same command run again finishes it.
func (d *checker) checkUpgrades() {
	plans, err := upgrade.Plans(d.h)
	if err != nil {
		d.fail("upgrade", err, "")
		return
	}
	for _, p := range plans {
		ids := make([]string, len(p.Sources))
		for i, s := range p.Sources {
			ids[i] = s.SourceID
		}
		d.fails("upgrade", errcode.RetirementPartial,
			"run fm extension upgrade "+p.ExtensionID+" "+p.PackageDir+" --trust-same-user-code again to finish it",
			"the upgrade of %s stopped before its last step (plan %s/%s.json; sources it moves: %s): some may be unregistered", p.ExtensionID, upgrade.Dir(d.h), p.ExtensionID, strings.Join(ids, ", "))
	}
}
