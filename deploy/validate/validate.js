// Validates Kubernetes objects against the Kubernetes API schemas, offline: every document of
// every YAML file named on the command line (kubectl kustomize output) must be an object whose
// apiVersion and kind kubernetes-models (core Kubernetes) or @kubernetes-models/prometheus-operator
// (monitoring.coreos.com) has a schema for, and must pass that schema (types, required fields,
// enums, formats). An object of a kind neither knows fails: nothing is skipped silently. The
// schemas do not reject unknown fields (the API server does, with strict field validation); the
// fields dattn relies on are exercised by deploy/manifests_test instead.
//
// Usage: node validate.js FILE.yaml...   (with NODE_PATH at the node_modules scripts/setup.sh
// installed). Prints one line per object and a summary; exit 0 when all are valid, 1 otherwise.
"use strict";

const fs = require("fs");
const yaml = require("js-yaml");

function modelFor(apiVersion, kind) {
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
  let path;
  if (group === "monitoring.coreos.com") {
    path = `@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}/${kind}`;
  } else if (group === "") {
    path = `kubernetes-models/${version}/${kind}`;
  } else {
    path = `kubernetes-models/${group}/${version}/${kind}`;
  }
  try {
    return require(path)[kind];
  } catch (e) {
    if (e.code === "MODULE_NOT_FOUND" || e.code === "ERR_PACKAGE_PATH_NOT_EXPORTED") return undefined;
    throw e;
  }
}

let objects = 0;
let failures = 0;
for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d !== null);
  if (docs.length === 0) {
    console.log(`${file}: no objects`);
    failures++;
  }
  for (const doc of docs) {
    objects++;
    const what = `${file}: ${doc.apiVersion}/${doc.kind} ${doc.metadata && doc.metadata.name}`;
    const Model = typeof doc.apiVersion === "string" && typeof doc.kind === "string"
      ? modelFor(doc.apiVersion, doc.kind) : undefined;
    if (Model === undefined) {
      console.log(`${what}: INVALID: no schema for apiVersion ${JSON.stringify(doc.apiVersion)} ` +
                  `kind ${JSON.stringify(doc.kind)}`);
      failures++;
      continue;
    }
    try {
      new Model(doc).validate();
      console.log(`${what}: valid`);
    } catch (e) {
      console.log(`${what}: INVALID: ${e.message}`);
      failures++;
    }
  }
}
console.log(`${objects} object(s), ${failures} invalid`);
process.exit(failures === 0 && objects > 0 ? 0 : 1);
