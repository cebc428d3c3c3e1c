/**
 * DockerMPI jobs panel: the user's MPI jobs in JupyterLab's left sidebar, with their
 * output in main-area views. Every call goes through the notebook server's
 * `dockermpi` extension (`<base>dockermpi/...`), which adds the user's token.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { DockerMPIApi } from './api';
import { OutputView } from './output';
import { JobsPanel } from './panel';

const OPEN_PANEL = 'dockermpi:open-jobs-panel';

const jobsIcon = new LabIcon({
  name: 'dockermpi:jobs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="2" y="3" width="8" height="6" rx="1"/><rect x="14" y="3" width="8" height="6" rx="1"/>' +
    '<rect x="2" y="15" width="8" height="6" rx="1"/><rect x="14" y="15" width="8" height="6" rx="1"/>' +
    '<rect x="5.5" y="9" width="1" height="6"/><rect x="17.5" y="9" width="1" height="6"/>' +
    '<rect x="10" y="11.5" width="4" height="1"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'dockermpi-jobs:plugin',
  description: "A sidebar panel of the user's DockerMPI jobs",
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const api = new DockerMPIApi();
    const outputs = new Map<string, OutputView>();

    const openOutput = (jobId: string, label: string) => {
      let view = outputs.get(jobId);
      if (!view || view.isDisposed) {
        view = new OutputView(api, jobId, label);
        view.title.icon = jobsIcon;
        outputs.set(jobId, view);
        view.disposed.connect(() => outputs.delete(jobId));
        app.shell.add(view, 'main', { mode: 'split-right' });
      }
      app.shell.activateById(view.id);
    };

    const panel = new JobsPanel({
      api,
      openOutput,
      openFolder: async path => {
        // go-to-path only logs a missing folder: ask first, so the panel can say so.
        await app.serviceManager.contents.get(path, { content: false });
        return app.commands.execute('filebrowser:go-to-path', { path });
      }
    });
    panel.title.icon = jobsIcon;
    app.shell.add(panel, 'left', { rank: 700 });
    restorer?.add(panel, panel.id);

    app.commands.addCommand(OPEN_PANEL, {
      label: 'Open the MPI jobs panel',
      caption: "Show the user's DockerMPI jobs",
      icon: jobsIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN_PANEL, category: 'DockerMPI' });

    // Follow the jobs from the start, so a job that ends can notify even while the
    // panel is closed.
    void app.restored.then(() => panel.start());
  }
};

export default plugin;
