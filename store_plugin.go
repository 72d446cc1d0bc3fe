package caddyleader

// SecretsDigest is the keyed digest of secrets (passwords, the contents of key and token
// files) that a Store's StoreKey includes instead of the secrets themselves, for stores in
// other modules: a reload that changes a secret starts a new candidacy, and the key never
// shows a secret. The key lives only in this process.
func SecretsDigest(secrets ...[]byte) string { return secretsDigest(secrets...) }
