package model

// Stamp keys written at mint (docs/box.md, "Stamps"). A box minted before a key
// existed simply lacks it.
const (
	StampPrefix      = "user.box."
	StampTemplate    = "user.box.template"
	StampUser        = "user.box.user"
	StampMinted      = "user.box.minted"
	StampVersion     = "user.box.version"
	StampImage       = "user.box.image"
	StampFingerprint = "user.box.fingerprint"
	// StampImageServer is the image server a REMOTE:ALIAS image was
	// pulled from (the remote's address at mint time).
	StampImageServer = "user.box.image_server"
	StampType        = "user.box.type"
	// StampBuilder marks a builder box of a template's image (the
	// template's name): box removes one a killed build left behind.
	StampBuilder = "user.box.builder"
	// StampStandby marks a standby box of a template (the template's
	// name): minted from its image, booted once, stopped, and taken by the
	// next box new of the template (box templates warm).
	StampStandby = "user.box.standby"
	StampOrigin  = "user.box.origin"
)

// NoteNoDiskLimit starts the note of a box whose root disk size the pool
// does not enforce.
const NoteNoDiskLimit = "no disk limit"
