#!/bin/sh
# Writes a throwaway PKI for the rendezvous store's TLS tests into the folder $1 (created if
# missing): ca.pem/ca.key (the "cluster CA"), other-ca.pem/other-ca.key (a CA the store does not
# trust), server.pem/key and client.pem/key signed by ca, rogue.pem/key signed by other-ca. EC P-256
# keys, valid for two days, usable as TLS server and client certificates. Generated at test time with
# the openssl CLI, so that no private key is checked in.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' >leaf.ext
printf 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n' >ca.ext
key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null
}
csr() {
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
}
ca() {
  csr "$1"
  openssl x509 -req -in "$1.csr" -signkey "$1.key" -out "$1.pem" -days 2 -extfile ca.ext 2>/dev/null
}
leaf() {
  csr "$1"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile leaf.ext 2>/dev/null
}
ca ca
ca other-ca
leaf server ca
leaf client ca
leaf rogue other-ca
