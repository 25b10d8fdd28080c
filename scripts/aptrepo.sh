#!/usr/bin/env bash
# aptrepo.sh OUT KEY: makes OUT/apt, a signed apt repository of the .debs
# in OUT (docs/install.md, "From the apt repository"), with Debian's own
# tool (apt-ftparchive, package apt-utils) and gpg, signed by KEY (a key in
# gpg's keyring, GNUPGHOME honoured):
#
#   OUT/apt/pool/main/*.deb
#   OUT/apt/dists/stable/main/binary-ARCH/Packages(.gz)
#   OUT/apt/dists/stable/{Release,Release.gpg,InRelease}
#   OUT/apt/box-archive-keyring.gpg    the key's public part, for signed-by
#
# scripts/package.sh runs it when BOX_RELEASE_KEY is set. A release's
# repository holds that release's packages: published over the last one,
# apt-get upgrade takes them.
set -euo pipefail
out=$1 key=$2
command -v apt-ftparchive >/dev/null || {
	echo "aptrepo: apt-ftparchive is missing: apt-get install apt-utils (make deps)" >&2
	exit 1
}
repo=$out/apt
rm -rf "$repo"
mkdir -p "$repo/pool/main"
cp "$out"/*.deb "$repo/pool/main/"
archs=$(for d in "$repo"/pool/main/*.deb; do dpkg-deb -f "$d" Architecture; done | sort -u | xargs)
cd "$repo"
for a in $archs; do
	mkdir -p "dists/stable/main/binary-$a"
	apt-ftparchive --arch "$a" packages pool/main >"dists/stable/main/binary-$a/Packages"
	gzip -9nk "dists/stable/main/binary-$a/Packages"
done
apt-ftparchive \
	-o APT::FTPArchive::Release::Origin=box \
	-o APT::FTPArchive::Release::Label=box \
	-o APT::FTPArchive::Release::Suite=stable \
	-o APT::FTPArchive::Release::Codename=stable \
	-o APT::FTPArchive::Release::Components=main \
	-o "APT::FTPArchive::Release::Architectures=$archs" \
	-o APT::FTPArchive::Release::Description="box and drill" \
	release dists/stable >Release.new # not in dists/stable: it would list itself
mv Release.new dists/stable/Release
gpg --batch --yes --local-user "$key" --clearsign -o dists/stable/InRelease dists/stable/Release
gpg --batch --yes --local-user "$key" --armor --detach-sign -o dists/stable/Release.gpg dists/stable/Release
gpg --batch --export "$key" >box-archive-keyring.gpg
echo "aptrepo: $repo, signed by $key (arch $archs)" >&2
