package homeimport

import (
	"strconv"
	"strings"

	"firstmate.dev/fm/internal/errcode"
	"firstmate.dev/fm/internal/procevent"
	"firstmate.dev/fm/internal/protocol"
)

// The earlier implementation's text records (docs/configuration.md, "Moving a
// home onto fm"): key=value lines in a fixed order, each record ending with a
// newline.

// extensionOwnerSchema is the schema line of its extension owners.
const extensionOwnerSchema = "fm-procevent-extension-owner.v1"

// Inbox names of the earlier implementation beside fm's.
const (
	adapterSuffix    = procevent.LegacyAdapterSuffix
	extensionSuffix  = ".extension"
	generationSuffix = ".generation"
	resultSuffix     = ".result"
	metaSuffix       = ".meta.json"
	handledSuffix    = ".handled"
	pendingSuffix    = ".pending"
)

// sidecars are the owner files of a result that fm's .meta.json replaces.
var sidecars = []string{adapterSuffix, extensionSuffix, generationSuffix}

// splitName splits an inbox name <source-id>.<seq><suffix>.
func splitName(n string) (id string, seq int64, suffix string, ok bool) {
	for _, s := range []string{resultSuffix, metaSuffix, handledSuffix, pendingSuffix, adapterSuffix, extensionSuffix, generationSuffix} {
		rest, found := strings.CutSuffix(n, s)
		if !found {
			continue
		}
		dot := strings.LastIndexByte(rest, '.')
		if dot < 0 {
			return "", 0, "", false
		}
		digits := rest[dot+1:]
		seq, err := strconv.ParseInt(digits, 10, 64)
		if err != nil || seq < 1 || digits != strconv.FormatInt(seq, 10) || protocol.CheckSourceID(rest[:dot]) != nil {
			return "", 0, "", false
		}
		return rest[:dot], seq, s, true
	}
	return "", 0, "", false
}

// recordLines splits a text record into its lines; it must end with a
// newline.
func recordLines(data []byte, what string) ([]string, error) {
	text, ok := strings.CutSuffix(string(data), "\n")
	if !ok {
		return nil, errcode.New(errcode.SchemaInvalid, "%s does not end with a newline", what)
	}
	return strings.Split(text, "\n"), nil
}

// fields reads lines[i] as keys[i]=<value> for every key, in order.
func fields(lines []string, keys []string, what string) (map[string]string, error) {
	if len(lines) < len(keys) {
		return nil, errcode.New(errcode.SchemaInvalid, "%s has %d lines; it needs at least %d", what, len(lines), len(keys))
	}
	out := make(map[string]string, len(keys))
	for i, k := range keys {
		v, ok := strings.CutPrefix(lines[i], k+"=")
		if !ok {
			return nil, errcode.New(errcode.SchemaInvalid, "%s: line %d must be %s=<value>", what, i+1, k)
		}
		out[k] = v
	}
	return out, nil
}

// capability reads a capability_version value.
func capability(v, what string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != v {
		return 0, errcode.New(errcode.SchemaInvalid, "%s: capability_version %q is not a number", what, v)
	}
	return n, nil
}

// parseSource converts the text registration of source id at path into fm's
// registration ([REG-2]). An extension record keeps its extension identity,
// config reference and registration token, so the token the operator holds
// still retires exactly that generation ([REG-4]). A built-in record carries
// no token (the earlier implementation retired built-ins by their content,
// as fm's --if-matches does), so it gets a fresh random one, which fm never
// prints.
func parseSource(data []byte, id, path string) (*procevent.Registration, error) {
	what := "registration " + path + " (earlier format)"
	lines, err := recordLines(data, what)
	if err != nil {
		return nil, err
	}
	r := &procevent.Registration{Schema: procevent.RegistrationSchema, SourceID: id}
	if len(lines) > 1 && lines[1] == "owner=extension" {
		keys := []string{"adapter", "owner", "extension_schema", "extension_id", "extension_version", "capability_version",
			"package_digest", "binding_digest", "config_ref", "registration_token", "argc"}
		f, err := fields(lines, keys, what)
		if err != nil {
			return nil, err
		}
		if len(lines) != 12 || lines[11] != "argv:" || f["argc"] != "0" || f["extension_schema"] != extensionOwnerSchema {
			return nil, errcode.New(errcode.SchemaInvalid, "%s: an extension record is exactly 12 lines, schema %s, argc=0 and an empty argv", what, extensionOwnerSchema)
		}
		if r.CapabilityVersion, err = capability(f["capability_version"], what); err != nil {
			return nil, err
		}
		r.Kind, r.Adapter, r.Token, r.ConfigRef = procevent.KindExtension, f["adapter"], f["registration_token"], f["config_ref"]
		r.ExtensionID, r.ExtensionVersion = f["extension_id"], f["extension_version"]
		r.PackageDigest, r.BindingDigest = f["package_digest"], f["binding_digest"]
	} else {
		f, err := fields(lines, []string{"adapter", "argc"}, what)
		if err != nil {
			return nil, err
		}
		n, perr := strconv.Atoi(f["argc"])
		if perr != nil || n < 0 || strconv.Itoa(n) != f["argc"] || len(lines) != 3+n || lines[2] != "argv:" {
			return nil, errcode.New(errcode.SchemaInvalid, "%s: a built-in record is adapter=, argc=<N>, argv: and exactly N argument lines", what)
		}
		r.Kind, r.Adapter, r.Token, r.Argv = procevent.KindBuiltin, f["adapter"], protocol.NewRequestID(), lines[3:]
	}
	if err := procevent.CheckRegistration(r, what); err != nil {
		return nil, err
	}
	return r, nil
}

// parseOwner reads the owner sidecars of one result into its meta (without
// its capture time): the adapter line and, for an extension result, the
// exact extension identity it was captured under [CAP-4].
func parseOwner(adapter, extension []byte, hasExtension bool, m *procevent.Meta, what string) error {
	name, ok := strings.CutSuffix(string(adapter), "\n")
	if !ok || strings.Contains(name, "\n") {
		return errcode.New(errcode.SchemaInvalid, "%s: the adapter sidecar must be the adapter name and one newline", what)
	}
	m.Adapter, m.Kind = name, procevent.KindBuiltin
	if hasExtension {
		lines, err := recordLines(extension, what+" extension sidecar")
		if err != nil {
			return err
		}
		keys := []string{"schema", "extension_id", "extension_version", "capability_version", "package_digest", "binding_digest"}
		f, err := fields(lines, keys, what+" extension sidecar")
		if err != nil {
			return err
		}
		if len(lines) != 6 || f["schema"] != extensionOwnerSchema {
			return errcode.New(errcode.SchemaInvalid, "%s: the extension sidecar is exactly 6 lines of schema %s", what, extensionOwnerSchema)
		}
		if m.CapabilityVersion, err = capability(f["capability_version"], what); err != nil {
			return err
		}
		m.Kind, m.ExtensionID, m.ExtensionVersion = procevent.KindExtension, f["extension_id"], f["extension_version"]
		m.PackageDigest, m.BindingDigest = f["package_digest"], f["binding_digest"]
	}
	return procevent.CheckMeta(m, what)
}
