# box and drill. Run as root on a Debian bookworm machine (see README.md).
#
#   make drill   build the hermetic world and run the drill in it
#   make test    install what is missing and run every test tier
#   make package .debs for box and drill, a tarball and SHA256SUMS in dist/
#   make test-machine  the machine tier alone (a booted Debian host in the world; make test runs it too)
#   make release VERSION=x.y.z
#                tag vx.y.z if RUNS.md proves HEAD (docs/release.md)
#
GO       ?= go
# The commit the binaries are built from, -dirty when the tree has changes
# (untracked files included: they can be code). A recorded drill run names
# it, and the release gate refuses a dirty one.
VERSION  ?= $(shell v=$$(git describe --always 2>/dev/null) || v=dev; \
	[ -z "$$(git status --porcelain 2>/dev/null)" ] || v=$$v-dirty; echo $$v)
LDFLAGS  := -s -w -X main.version=$(VERSION)
export CGO_ENABLED = 0

.PHONY: all deps build drill drill-cluster world world-down test test-machine unit bench soak package release clean

all: build

deps:
	scripts/deps.sh

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/drill ./cmd/drill
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/box ./cmd/box

# The world stays up after `make world` (fast re-runs); `make world-down`
# removes it.
world: deps build
	bin/drill world up

world-down: build
	bin/drill world down

# DRILL_ARGS passes options, e.g. DRILL_ARGS="--json" or
# DRILL_ARGS="--mutate bridge-drop,port-isolation".
drill: world
	bin/drill run $(DRILL_ARGS)

# The drill on a cluster world of 3 members (docs/cluster.md);
# `bin/drill world down --name boxc` removes it.
drill-cluster: deps build
	bin/drill world up --name boxc --cluster 3
	BOX_WORLD_STATE=/run/box-world/boxc/state.json bin/drill run $(DRILL_ARGS)

test:
	scripts/test.sh

# Unit tier only: no root, no world.
unit:
	$(GO) test -count=1 ./...

bench:
	scripts/bench.sh

# Repeated clean and mutated drill runs; counts any unexpected verdict.
# SOAK_ARGS="20 10" sets the clean runs and the runs per mutation.
soak:
	scripts/soak.sh $(SOAK_ARGS)

# Static binaries with the version, man pages, completions and the boot
# units, as .debs (box, drill), a tarball and SHA256SUMS, in dist/.
package:
	VERSION=$(VERSION) scripts/package.sh dist

# The machine tier alone (make test runs it beside the others; docs/world.md, "The machine"):
# a world with its Debian machine (this tree's .debs installed by apt),
# and the tests that boot it, run host mode in it and count the boot
# window. Minutes the first time (the machine is built and cached).
MACHINE_WORLD ?= boxmac
test-machine: build package
	bin/drill world status --name $(MACHINE_WORLD) >/dev/null 2>&1 || bin/drill world up --name $(MACHINE_WORLD) --machine
	BOX_MACHINE_STATE=/run/box-world/$(MACHINE_WORLD)/state.json BOX_REQUIRE_TIERS=1 $(GO) test -tags machine -p 1 -count=1 -timeout 60m -v -run '^TestSystemMachine' ./fixtures/world/

# The release gate: refuses unless RUNS.md records a passing host run of
# HEAD's code (scripts/release.sh says what is missing). No waiver.
release:
	GO=$(GO) scripts/release.sh $(if $(filter file,$(origin VERSION)),,$(VERSION))

clean:
	rm -rf bin dist
