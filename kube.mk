# Kubernetes: the Helm chart's tests. Included from the Makefile.
HELM_VERSION := v3.22.0
HELM := $(BIN)/helm
HELM_STAMP := $(BIN)/.helm-$(HELM_VERSION)
CHART := deploy/helm/rewind

.PHONY: test-helm helm kube-bin kube-debs test-kube

# The control plane of the end-to-end tests (internal/kubetest): the
# versions are pinned by the wrapper modules' go.mod files.
KUBE_BIN_STAMP := $(BIN)/.kube-bin
KUBE_BIN_MODS := internal/kubetest/kubebin/go.mod internal/kubetest/jobsetbin/go.mod
MPIJOB_CRD := manifests/base/kubeflow.org_mpijobs.yaml
JOBSET_CRD := config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
JOBSET_WEBHOOKS := config/components/webhook/manifests.yaml
TRAINER := github.com/kubeflow/trainer/v2
# No symbol table or DWARF: the tests never debug these, and linking the
# control plane's binaries without them is much quicker.
KUBE_BUILD := $(GO) build -ldflags='-s -w'

## kube-bin: kube-apiserver and kube-controller-manager (k8s.io/kubernetes), mpi-operator, the JobSet controller, the Kubeflow Trainer controller, built from the Go module proxy into bin/; etcd from Debian.
kube-bin: $(KUBE_BIN_STAMP)

$(KUBE_BIN_STAMP): $(KUBE_BIN_MODS) kube.mk | kube-debs
	@mkdir -p $(BIN)
	cd internal/kubetest/kubebin && $(KUBE_BUILD) -o $(BIN)/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		github.com/kubeflow/mpi-operator/cmd/mpi-operator
	cp "$$(cd internal/kubetest/kubebin && $(GO) list -m -f '{{.Dir}}' github.com/kubeflow/mpi-operator)/$(MPIJOB_CRD)" $(BIN)/kubeflow.org_mpijobs.yaml
	cd internal/kubetest/jobsetbin && $(KUBE_BUILD) -o $(BIN)/jobset-controller sigs.k8s.io/jobset
	install -m 0644 "$$(cd internal/kubetest/jobsetbin && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/jobset)/$(JOBSET_CRD)" $(BIN)/jobset.x-k8s.io_jobsets.yaml
	install -m 0644 "$$(cd internal/kubetest/jobsetbin && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/jobset)/$(JOBSET_WEBHOOKS)" $(BIN)/jobset-webhooks.yaml
	cd internal/kubetest/jobsetbin && $(KUBE_BUILD) -o $(BIN)/trainer-controller-manager $(TRAINER)/cmd/trainer-controller-manager
	mkdir -p $(BIN)/trainer && d="$$(cd internal/kubetest/jobsetbin && $(GO) list -m -f '{{.Dir}}' $(TRAINER))" && \
		install -m 0644 $$d/manifests/base/crds/trainer.kubeflow.org_*.yaml $$d/manifests/base/runtimes/torch_distributed.yaml $(BIN)/trainer/
	@touch $@

# etcd from Debian (3.4 works with kube-apiserver 1.37).
kube-debs:
	@command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server)

## test-kube: the controller end to end against a real etcd, kube-apiserver (RBAC on), kube-controller-manager, mpi-operator, the JobSet and Kubeflow Trainer controllers, the chart applied, real agents and ranks.
test-kube: kube-bin helm build
	$(HELM) template rewind $(CHART) --namespace rewind > $(BIN)/rewind-chart.yaml
	REWIND_KUBE_BIN=$(BIN) REWIND_BIN=$(BIN)/rewind REWIND_CHART_RENDERED=$(BIN)/rewind-chart.yaml REWIND_REQUIRE_KUBE=1 \
		$(GO) test -count=1 -timeout 15m -v -run . ./kube/e2e 2>&1 | tee $(BIN)/test-kube.log | grep -E '^(=== RUN|--- |\s+\S+_test.go|ok|FAIL|PASS)'; \
		test $${PIPESTATUS[0]} -eq 0

## helm: a pinned helm under bin/ (built from source with go install).
helm: $(HELM_STAMP)

# Under a lock: make test builds it in the background while the front may
# ask for it; a second build waits, then finds the stamp.
$(HELM_STAMP):
	@mkdir -p $(BIN)
	flock $(BIN)/.helm.lock sh -c '[ -f $@ ] || { $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && touch $@; }'

## test-helm: helm lint and helm template of the chart, its RBAC grants exactly what kube/ calls, its dashboard and alert rules are valid (promtool).
test-helm: prometheus
	@if ! $(MAKE) --no-print-directory helm; then \
		echo "test-helm: SKIPPED: could not build helm $(HELM_VERSION) with go install (no module proxy?)"; exit 0; fi; \
	set -e; \
	$(HELM) lint --strict $(CHART); \
	$(HELM) template rewind $(CHART) --namespace rewind > $(BIN)/rewind-chart.yaml; \
	$(HELM) template rewind $(CHART) --namespace rewind \
		--set coordinator.persistence.storageClass=fast,agent.socketGroup=1000,coordinator.policy=nvme:every=10 > /dev/null; \
	$(HELM) template rewind $(CHART) --namespace rewind --set tls.enabled=false | grep -q -- '- --insecure'; \
	$(HELM) template rewind $(CHART) --namespace rewind --set tls.enroll.enabled=false | grep -q 'secretName: rewind-agent-tls'; \
	$(HELM) template rewind $(CHART) --namespace rewind \
		--set metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true > $(BIN)/rewind-chart-monitoring.yaml; \
	REWIND_CHART_RENDERED=$(BIN)/rewind-chart.yaml REWIND_CHART_MONITORING=$(BIN)/rewind-chart-monitoring.yaml REWIND_REQUIRE_PROMETHEUS=1 \
		$(GO) test -count=1 -run '^TestChart(RBAC|CoordinatorReadiness|TLS|Monitoring|MonitoringDefaults)$$' ./kube; \
	echo "test-helm: chart lints, renders, runs mutual TLS, grants only what the controller calls, and its dashboard and alert rules are valid"
