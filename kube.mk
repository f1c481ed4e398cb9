# Kubernetes: the Helm chart's tests. Included from the Makefile.
HELM_VERSION := v3.22.0
HELM := $(BIN)/helm
HELM_STAMP := $(BIN)/.helm-$(HELM_VERSION)
CHART := deploy/helm/rewind

.PHONY: test-helm helm

## helm: a pinned helm under bin/ (built from source with go install).
helm: $(HELM_STAMP)

$(HELM_STAMP):
	$(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@touch $@

## test-helm: helm lint and helm template of the chart, and its RBAC grants exactly what kube/ calls.
test-helm:
	@if ! $(MAKE) --no-print-directory helm; then \
		echo "test-helm: SKIPPED: could not build helm $(HELM_VERSION) with go install (no module proxy?)"; exit 0; fi; \
	set -e; \
	$(HELM) lint --strict $(CHART); \
	$(HELM) template rewind $(CHART) --namespace rewind > $(BIN)/rewind-chart.yaml; \
	$(HELM) template rewind $(CHART) --namespace rewind \
		--set coordinator.persistence.storageClass=fast,agent.socketGroup=1000,coordinator.policy=nvme:every=10 > /dev/null; \
	REWIND_CHART_RENDERED=$(BIN)/rewind-chart.yaml $(GO) test -count=1 -run '^TestChart(RBAC|CoordinatorReadiness)$$' ./kube; \
	echo "test-helm: chart lints, renders, and grants only what the controller calls"
