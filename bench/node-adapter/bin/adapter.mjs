#!/usr/bin/env node
// The small Node adapter of bench/run.sh's poll-node-overhead figure: it
// answers a handshake and a source.poll with no result, as a real long-poll
// adapter does when nothing happened. Node's own start-up dominates its cost,
// which is the point: fm's overhead is measured against two bare runs of it.
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const verb = process.argv[2];
let res;
if (verb === "handshake") {
  res = {
    adapter_names: req.capability.adapter_names,
    capability: req.capability.name,
    capability_version: 1,
    extension_id: req.extension_id,
    extension_version: req.extension_version,
    host_protocol: 1,
    request_id: req.request_id,
    schema: "firstmate.extension-handshake-response.v1",
  };
} else {
  res = {
    error: null,
    ok: true,
    request_id: req.request_id,
    result: { output: "", status: "no-result" },
    schema: "firstmate.extension-response.v1",
  };
}
process.stdout.write(JSON.stringify(res));
