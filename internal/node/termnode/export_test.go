package termnode

// SetPasswdFile makes m look up login shells in path instead of
// /etc/passwd, so tests control which shell starts.
func SetPasswdFile(m *Manager, path string) { m.passwdFile = path }
