const fs = require("fs"), net = require("net"), os = require("os"), path = require("path");
const [secret, port, pid, target] = process.argv.slice(2);
const out = [];
function tr(name, fn) {
  try { fn(); out.push(name + "=ok"); } catch (e) { out.push(name + "=" + (e.code || "other")); }
}
tr("secret", () => fs.readFileSync(secret));
tr("write", () => fs.writeFileSync(target, "x"));
tr("state", () => fs.writeFileSync(process.env.FIRSTMATE_EXTENSION_STATE + "/probe", "x"));
tr("tmp", () => { const d = fs.mkdtempSync(path.join(os.tmpdir(), "probe")); fs.rmdirSync(d); });
tr("devnull", () => fs.writeFileSync("/dev/null", "x"));
tr("kill", () => process.kill(Number(pid), 0));
tr("etc", () => fs.readFileSync("/etc/hostname"));
const s = net.connect(Number(port), "127.0.0.1");
const done = (r) => { out.push("tcp=" + r); process.stdout.write(out.join(" ")); s.destroy(); };
s.on("connect", () => done("ok"));
s.on("error", (e) => done(e.code || "other"));
